/* tn.h -- helpers of the kvo_nats tests. */
#ifndef TN_H
#define TN_H

#include "kt.h"

/* A "mute" NATS server on 127.0.0.1:port: it accepts TCP connections and
 * never says a word, so a client's (re)connect attempt hangs in the
 * handshake until its connect timeout (a hung server, or one behind a
 * dropped route). Returns the listening socket (ck_assert on failure). */
int tn_mute_listen(uint16_t port);
/* Accept one client on it; ck_assert within timeout_ms. The connection is
 * returned open (close it when done) so the attempt stays pending. */
int tn_mute_accept(int lfd, long timeout_ms);

#endif /* TN_H */
