/* Frame and handshake codecs (see en_frame.h for the layouts). */
#include "engines/en_frame.h"

#include <string.h>

#include "cohort.h"

void en_hdr_encode(const en_hdr_t *h, uint8_t out[EN_HDR_SIZE])
{
    en_put32(out, EN_FRAME_MAGIC);
    out[4] = h->type;
    out[5] = h->flags;
    en_put16(out + 6, 0);
    en_put32(out + 8, h->comm);
    en_put32(out + 12, h->tag);
    en_put64(out + 16, h->seq);
    en_put64(out + 24, h->sig);
    en_put64(out + 32, h->off);
    en_put64(out + 40, h->len);
}

int en_hdr_decode(const uint8_t *buf, size_t len, en_hdr_t *out)
{
    /* Reject a wrong magic as soon as its bytes are in, so garbage is seen
     * even when fewer than a header's worth of bytes ever arrive. */
    static const uint8_t magic[4] = {'C', 'O', 'H', 'F'};
    size_t m = len < 4 ? len : 4;
    if (memcmp(buf, magic, m) != 0) return COH_EPROTO;
    if (len < EN_HDR_SIZE) return 0;
    en_hdr_t h = {.type = buf[4],
                  .flags = buf[5],
                  .comm = en_get32(buf + 8),
                  .tag = en_get32(buf + 12),
                  .seq = en_get64(buf + 16),
                  .sig = en_get64(buf + 24),
                  .off = en_get64(buf + 32),
                  .len = en_get64(buf + 40)};
    if (h.flags != 0 || en_get16(buf + 6) != 0) return COH_EPROTO;
    switch (h.type) {
    case EN_FRAME_DATA:
        if (h.len > EN_MAX_PAYLOAD || h.off > EN_MAX_PAYLOAD) return COH_EPROTO;
        break;
    case EN_FRAME_ABORT:
        if (h.len < 4 || h.len > EN_MAX_ABORT) return COH_EPROTO;
        break;
    case EN_FRAME_DGCTL:
        if (h.len < 24 || h.len > EN_MAX_ABORT || h.len % 8) return COH_EPROTO;
        break;
    case EN_FRAME_BYE:
    case EN_FRAME_ACK:
        if (h.len != 0) return COH_EPROTO;
        break;
    default: return COH_EPROTO;
    }
    *out = h;
    return EN_HDR_SIZE;
}

void en_hello_encode(const en_hello_t *h, uint8_t out[EN_HELLO_SIZE])
{
    en_put32(out, EN_HELLO_MAGIC);
    en_put16(out + 4, h->version);
    en_put16(out + 6, h->kind);
    en_put32(out + 8, h->rank);
    en_put32(out + 12, h->world);
    en_put32(out + 16, h->rail);
    en_put32(out + 20, h->nrails);
    memcpy(out + 24, h->token, EN_TOKEN_MAX);
    en_put32(out + 88, h->flags);
    en_put32(out + 92, h->via);
    en_put64(out + 96, h->resume_off);
    en_put64(out + 104, h->epoch);
}

int en_hello_decode(const uint8_t *buf, size_t len, en_hello_t *out)
{
    static const uint8_t magic[4] = {'C', 'O', 'H', 'H'};
    size_t m = len < 4 ? len : 4;
    if (memcmp(buf, magic, m) != 0) return COH_EPROTO;
    if (len < EN_HELLO_SIZE) return 0;
    en_hello_t h = {.version = en_get16(buf + 4),
                    .kind = en_get16(buf + 6),
                    .rank = en_get32(buf + 8),
                    .world = en_get32(buf + 12),
                    .rail = en_get32(buf + 16),
                    .nrails = en_get32(buf + 20)};
    memcpy(h.token, buf + 24, EN_TOKEN_MAX);
    h.flags = en_get32(buf + 88);
    h.via = en_get32(buf + 92);
    h.resume_off = en_get64(buf + 96);
    h.epoch = en_get64(buf + 104);
    if ((h.flags & ~(EN_HELLO_RESUME | EN_HELLO_REJOIN)) || h.via >= 1024) return COH_EPROTO;
    if (h.version != EN_PROTO_VERSION) return COH_EPROTO;
    if (h.kind < EN_HELLO_DATA || h.kind > EN_HELLO_CTRL) return COH_EPROTO;
    if (h.world == 0 || h.rank >= h.world) return COH_EPROTO;
    *out = h;
    return EN_HELLO_SIZE;
}

void en_hello_set_token(en_hello_t *h, const char *token)
{
    memset(h->token, 0, EN_TOKEN_MAX);
    if (!token) return;
    size_t n = strlen(token);
    memcpy(h->token, token, n > EN_TOKEN_MAX ? EN_TOKEN_MAX : n);
}

int en_hello_token_ok(const en_hello_t *h, const char *token)
{
    uint8_t want[EN_TOKEN_MAX] = {0};
    if (token) {
        size_t n = strlen(token);
        memcpy(want, token, n > EN_TOKEN_MAX ? EN_TOKEN_MAX : n);
    }
    uint8_t diff = 0;
    for (int i = 0; i < EN_TOKEN_MAX; i++) diff |= (uint8_t)(want[i] ^ h->token[i]);
    return diff == 0;
}
