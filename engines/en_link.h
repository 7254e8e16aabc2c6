/*
 * en_link.h - what the ring transports (en_shm.c, en_verbs.c) share: the
 * queues of frames a link writes and completes, the check of a peer's
 * handshake, and the guard that keeps a link's pump from nesting.
 * Loop thread only.
 */
#ifndef COH_EN_LINK_H
#define COH_EN_LINK_H

#include "engines/engine.h"

/* Append w to the queue (head, tail), linked through tx_next. */
void en_wq_push(en_wreq_t **head, en_wreq_t **tail, en_wreq_t *w);
/* Complete every frame of the queue with 0 (detached first: a completion
 * may queue more). True when there was any. */
bool en_wq_run_done(en_wreq_t **head, en_wreq_t **tail);
/* Complete c's frames of the queue with 0 and leave the others queued
 * (a closing link: what it wrote was sent). */
void en_wq_done_of(en_conn_t *c, en_wreq_t **head, en_wreq_t **tail);
/* Complete every frame of c's send queue with status. */
void en_wq_fail_all(en_conn_t *c, en_wreq_t **head, en_wreq_t **tail, int status);

/* A peer's HELLO from in (EN_HELLO_SIZE bytes) on c, checked: the rail's
 * rules, no resume (kind names the link in the reason), and the dialled
 * rank answering. 0, or a status with the reason in why. */
int en_link_hello(en_conn_t *c, const uint8_t *in, int expect_peer, const char *kind, en_hello_t *h,
                  char *why, size_t cap);

/* step(arg) until nothing asked for another round, never nested: a
 * completion that reaches back into a link that is stepping asks again. */
typedef struct en_kick {
    bool running, again;
} en_kick_t;
void en_kick_run(en_kick_t *k, bool (*live)(void *arg), void (*step)(void *arg), void *arg);

#endif
