/* relay_int.h -- internals shared by the relay_*.c files: the pieces
 * relay_run.c glues together (ZMQ sources, the NATS publisher). */
#ifndef RELAY_INT_H
#define RELAY_INT_H

#include "kvo_map.h"
#include "relay.h"

/* ---- ZMQ sources (relay_source.c) ---------------------------------------*/
typedef struct relay_source relay_source;

typedef struct relay_source_cfg {
    const char *endpoint;        /* SUB */
    bool bind;
    const char *topic;
    const char *replay_endpoint; /* NULL = none */
    int hwm;
    int64_t max_msg_bytes;
    int linger_ms;
} relay_source_cfg;

kvo_status relay_source_new(relay_source **out, void *zctx,
                            const relay_source_cfg *cfg);
void relay_source_free(relay_source *s);
void *relay_source_sub(relay_source *s);    /* for zmq_poll */
void *relay_source_dealer(relay_source *s); /* NULL when none open */
/* Send ["", seq u64 BE] on the DEALER (opened on demand). */
kvo_status relay_source_replay_request(relay_source *s, uint64_t from_seq);
/* Close the DEALER: replies to earlier requests are gone with it. */
void relay_source_replay_abort(relay_source *s);

/* One received multipart message; frames valid until the next recv. */
typedef struct relay_rx {
    uint32_t n;                       /* frames received (may exceed max) */
    wire_frame frames[WIRE_CAP_MAX_FRAMES];
} relay_rx;

/* Non-blocking receive: KVO_OK with a message, KVO_EAGAIN when nothing is
 * waiting, KVO_ENET on a socket error. Frames beyond WIRE_CAP_MAX_FRAMES
 * are read and dropped (n still counts them). */
kvo_status relay_source_recv_sub(relay_source *s, relay_rx *rx);
kvo_status relay_source_recv_dealer(relay_source *s, relay_rx *rx);

/* ---- NATS publisher (relay_nats.c) --------------------------------------*/
typedef struct relay_nats relay_nats;

/* Connect (retrying in the background when the server is not up yet). On
 * failure err says why. */
kvo_status relay_nats_new(relay_nats **out, const relay_cfg *cfg, char *err,
                          size_t errsz);
/* Flushes while connected (2 s at most), closes (bounded: kvo_nats.h). */
void relay_nats_free(relay_nats *n);
/* As nats.c's callbacks last said: never waits for nats.c's lock. */
bool relay_nats_connected(relay_nats *n);
/* Publish with an optional KVO-Zmq-Seq header. KVO_EAGAIN when the message
 * could not be sent or buffered (reconnect buffer full). */
kvo_status relay_nats_publish(relay_nats *n, const char *subject,
                              bool has_range, uint64_t first, uint64_t last,
                              const uint8_t *body, size_t len);
/* Counters set by nats.c callbacks (read on the loop thread). */
void relay_nats_poll(relay_nats *n, relay_stats *st);

#endif /* RELAY_INT_H */
