/* tn.c -- helpers of the kvo_nats tests (see tn.h). */
#include "tn.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

int tn_mute_listen(uint16_t port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ck_assert_msg(bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0,
                  "cannot take port %u for the mute server", port);
    ck_assert_int_eq(listen(fd, 16), 0);
    return fd;
}

int tn_mute_accept(int lfd, long timeout_ms) {
    struct pollfd pf = {lfd, POLLIN, 0};
    ck_assert_msg(poll(&pf, 1, (int)timeout_ms) == 1,
                  "no client came to the mute server in %ld ms", timeout_ms);
    int c = accept(lfd, NULL, NULL);
    ck_assert_int_ge(c, 0);
    return c;
}
