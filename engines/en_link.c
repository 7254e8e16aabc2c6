/* What the ring transports share (en_link.h). */
#include "engines/en_link.h"

#include <stdio.h>

void en_wq_push(en_wreq_t **head, en_wreq_t **tail, en_wreq_t *w)
{
    w->tx_next = NULL;
    if (*tail)
        (*tail)->tx_next = w;
    else
        *head = w;
    *tail = w;
}

bool en_wq_run_done(en_wreq_t **head, en_wreq_t **tail)
{
    en_wreq_t *w = *head;
    if (!w) return false;
    *head = *tail = NULL;
    while (w) {
        en_wreq_t *next = w->tx_next;
        w->tx_next = NULL;
        if (w->conn) w->conn->writes_out--;
        w->done(w, 0);
        w = next;
    }
    return true;
}

void en_wq_done_of(en_conn_t *c, en_wreq_t **head, en_wreq_t **tail)
{
    en_wreq_t **pp = head, *last = NULL, *mine = NULL, **mt = &mine;
    while (*pp) {
        en_wreq_t *w = *pp;
        if (w->conn != c) {
            last = w;
            pp = &w->tx_next;
            continue;
        }
        *pp = w->tx_next;
        w->tx_next = NULL;
        *mt = w;
        mt = &w->tx_next;
    }
    *tail = last;
    while (mine) {
        en_wreq_t *w = mine;
        mine = w->tx_next;
        w->tx_next = NULL;
        c->writes_out--;
        w->done(w, 0);
    }
}

void en_wq_fail_all(en_conn_t *c, en_wreq_t **head, en_wreq_t **tail, int status)
{
    while (*head) {
        en_wreq_t *w = *head;
        *head = w->tx_next;
        w->tx_next = NULL;
        c->writes_out--;
        w->done(w, status);
    }
    *tail = NULL;
}

int en_link_hello(en_conn_t *c, const uint8_t *in, int expect_peer, const char *kind, en_hello_t *h,
                  char *why, size_t cap)
{
    if (en_hello_decode(in, EN_HELLO_SIZE, h) != EN_HELLO_SIZE) {
        snprintf(why, cap, "malformed handshake");
        return COH_EPROTO;
    }
    int r = en_rail_check_hello(c->rail, h, !c->outgoing, why, cap);
    if (r < 0) return r;
    if (h->flags & EN_HELLO_RESUME) {
        snprintf(why, cap, "a resume on %s link", kind);
        return COH_EPROTO;
    }
    if (c->outgoing && (int)h->rank != expect_peer) {
        snprintf(why, cap, "dialled rank %d but rank %u answered", expect_peer, h->rank);
        return COH_EPROTO;
    }
    return 0;
}

void en_kick_run(en_kick_t *k, bool (*live)(void *arg), void (*step)(void *arg), void *arg)
{
    if (k->running) {
        k->again = true;
        return;
    }
    k->running = true;
    do {
        k->again = false;
        if (live(arg)) step(arg);
    } while (k->again && live(arg));
    k->running = false;
}
