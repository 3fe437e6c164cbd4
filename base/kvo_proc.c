/* kvo_proc.c -- child processes: spawn with a log file, readiness polling,
 * stop what we started.
 *
 * Spawning is fork + exec (posix_spawn cannot set PR_SET_PDEATHSIG). The
 * child only makes async-signal-safe calls before exec (the parent may run
 * ZMQ or NATS threads). An exec failure is reported back over a close-on-exec
 * pipe, so kvo_proc_spawn fails synchronously instead of leaving a child
 * that exits 127 behind.
 *
 * The child leads its own process group (set on both sides of the fork, so
 * the group exists when spawn returns); stop and kill signal the whole group,
 * which takes a shell's children along. PR_SET_PDEATHSIG fires when the
 * *thread* that forked exits: spawn from the main thread.
 */
#include "kvo_proc.h"

#include "kvo_http.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define POLL_SLEEP_MS 20
#define DUMP_TAIL_BYTES (256u << 10)

/* The monotonic time ms milliseconds from now (negative ms: now). */
static uint64_t deadline_in(long ms) {
    return kvo_now_ns() + (uint64_t)(ms > 0 ? ms : 0) * 1000000u;
}

static long ms_left(uint64_t deadline_ns) {
    uint64_t now = kvo_now_ns();
    return now >= deadline_ns ? 0 : (long)((deadline_ns - now) / 1000000u);
}

/* ---- Finding executables ------------------------------------------------- */

static bool is_exe(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) &&
           access(path, X_OK) == 0;
}

static bool try_dir(const char *dir, size_t dirlen, const char *name, char *out,
                    size_t outsz) {
    if (dirlen == 0) dir = ".", dirlen = 1; /* empty PATH entry = cwd */
    int n = snprintf(out, outsz, "%.*s/%s", (int)dirlen, dir, name);
    return n > 0 && (size_t)n < outsz && is_exe(out);
}

kvo_status kvo_find_exe(const char *name, char *out, size_t outsz) {
    if (!name || !*name || !out || outsz == 0) return KVO_EINVAL;
    if (strchr(name, '/')) {
        if (strlen(name) >= outsz) return KVO_EINVAL;
        if (!is_exe(name)) return KVO_ENOTFOUND;
        snprintf(out, outsz, "%s", name);
        return KVO_OK;
    }
    const char *path = getenv("PATH");
    if (!path) path = "/usr/local/bin:/usr/bin:/bin";
    for (const char *p = path;;) {
        const char *colon = strchr(p, ':');
        size_t len = colon ? (size_t)(colon - p) : strlen(p);
        if (try_dir(p, len, name, out, outsz)) return KVO_OK;
        if (!colon) break;
        p = colon + 1;
    }
    static const char *const extra[] = {"/usr/sbin", "/usr/local/sbin",
                                        "/sbin"};
    for (size_t i = 0; i < KVO_ARRAY_LEN(extra); i++)
        if (try_dir(extra[i], strlen(extra[i]), name, out, outsz))
            return KVO_OK;
    out[0] = '\0';
    return KVO_ENOTFOUND;
}

/* ---- Spawn --------------------------------------------------------------- */

/* In the child, between fork and exec: async-signal-safe calls only. */
static void child_exec(const char *exe, char *const argv[], int logfd,
                       int errfd, pid_t parent) {
    int err = 0;
    setpgid(0, 0);
    if (prctl(PR_SET_PDEATHSIG, SIGTERM) != 0) goto fail;
    if (getppid() != parent) _exit(127); /* the parent died already */
    /* Dispositions the parent ignores survive exec: give them back. Every
     * signal is blocked until then (see kvo_proc_spawn): one sent to the
     * parent's group in this window stays pending and, unblocked below,
     * meets the default action instead of the parent's handler. */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof(dfl));
    dfl.sa_handler = SIG_DFL;
    for (int sig = 1; sig < NSIG; sig++) sigaction(sig, &dfl, NULL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    /* Nothing but 0-2 crosses exec (the parent's listening sockets would
     * otherwise stay bound in the child); errfd closes on exec, too. */
    close_range(3, ~0u, CLOSE_RANGE_CLOEXEC);
    int nullfd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (nullfd < 0 || dup2(nullfd, 0) < 0 || dup2(logfd, 1) < 0 ||
        dup2(logfd, 2) < 0)
        goto fail;
    execv(exe, argv);
fail:
    err = errno;
    if (write(errfd, &err, sizeof(err)) < 0) {
    }
    _exit(127);
}

kvo_status kvo_proc_spawn(kvo_proc *p, const char *name, char *const argv[],
                          const char *log_path) {
    if (!p || !argv || !argv[0] || !log_path) return KVO_EINVAL;
    char exe[4096];
    kvo_status st = kvo_find_exe(argv[0], exe, sizeof(exe));
    if (st != KVO_OK) return st;
    int logfd = open(log_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (logfd < 0) return KVO_EIO;
    int pipefd[2];
    if (pipe2(pipefd, O_CLOEXEC) != 0) {
        close(logfd);
        return KVO_EIO;
    }
    pid_t parent = getpid();
    /* Until the child has reset its dispositions it runs the parent's
     * handlers: a SIGTERM or SIGINT sent to the parent's process group (a
     * terminal's Ctrl-C, timeout(1), kill -TERM -PGID) in that window would
     * set the child's copy of a stop flag, which exec then discards -- the
     * signal would be lost and the program would run on, deaf to the stop
     * it was sent. So the fork happens with every signal blocked. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pid_t pid = fork();
    if (pid == 0) child_exec(exe, argv, logfd, pipefd[1], parent);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    close(pipefd[1]);
    close(logfd);
    if (pid < 0) {
        close(pipefd[0]);
        return KVO_EIO;
    }
    setpgid(pid, pid); /* also here: no race with an early stop */

    int child_err = 0;
    ssize_t n;
    do n = read(pipefd[0], &child_err, sizeof(child_err));
    while (n < 0 && errno == EINTR);
    close(pipefd[0]);
    if (n > 0) { /* exec failed: the child is exiting, reap it */
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
        }
        return child_err == ENOENT ? KVO_ENOTFOUND : KVO_EIO;
    }

    memset(p, 0, sizeof(*p));
    p->pid = pid;
    snprintf(p->name, sizeof(p->name), "%s", name ? name : argv[0]);
    snprintf(p->log_path, sizeof(p->log_path), "%s", log_path);
    return KVO_OK;
}

/* ---- Life and death ------------------------------------------------------ */

static void note_exit(kvo_proc *p, int wstatus) {
    p->exited = true;
    p->exit_status = WIFEXITED(wstatus)     ? WEXITSTATUS(wstatus)
                     : WIFSIGNALED(wstatus) ? 128 + WTERMSIG(wstatus)
                                            : 255;
    p->pid = 0;
}

/* Reaps p if it ended; true once it has. */
static bool try_reap(kvo_proc *p, int flags) {
    int ws;
    pid_t r;
    do r = waitpid(p->pid, &ws, flags);
    while (r < 0 && errno == EINTR);
    if (r == p->pid) {
        note_exit(p, ws);
        return true;
    }
    if (r < 0) { /* not our child any more (reaped elsewhere) */
        p->exited = true;
        p->exit_status = 255;
        p->pid = 0;
        return true;
    }
    return false;
}

bool kvo_proc_alive(kvo_proc *p) {
    if (!p || p->pid <= 0) return false;
    return !try_reap(p, WNOHANG);
}

/* True once the leader has ended (left as a zombie, so its pid and group id
 * cannot be reused yet). */
static bool leader_ended(pid_t pid) {
    siginfo_t si;
    memset(&si, 0, sizeof(si));
    if (waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT) != 0)
        return errno != EINTR;
    return si.si_pid == pid;
}

/* SIGKILL whatever is left of the group, then reap the leader. */
static void kill_group_and_reap(kvo_proc *p) {
    kill(-p->pid, SIGKILL);
    try_reap(p, 0);
}

void kvo_proc_stop(kvo_proc *p, long grace_ms) {
    if (!p || p->pid <= 0) return;
    kill(-p->pid, SIGTERM);
    uint64_t deadline = deadline_in(grace_ms);
    while (!leader_ended(p->pid) && ms_left(deadline) > 0)
        kvo_sleep_us((ms_left(deadline) < 10 ? ms_left(deadline) : 10) * 1000L);
    p->killed = !leader_ended(p->pid);
    kill_group_and_reap(p);
}

void kvo_proc_kill(kvo_proc *p) {
    if (!p || p->pid <= 0) return;
    kill_group_and_reap(p);
}

void kvo_proc_dump_log(const kvo_proc *p, int max_lines) {
    if (!p || !p->log_path[0] || max_lines <= 0) return;
    FILE *f = fopen(p->log_path, "rb");
    if (!f) {
        fprintf(stderr, "[%s] (no log at %s)\n", p->name, p->log_path);
        return;
    }
    char *buf = kvo_malloc(DUMP_TAIL_BYTES + 1);
    if (!buf) {
        fclose(f);
        return;
    }
    long start = 0;
    if (fseek(f, 0, SEEK_END) == 0) {
        long size = ftell(f);
        start = size > (long)DUMP_TAIL_BYTES ? size - (long)DUMP_TAIL_BYTES : 0;
    }
    fseek(f, start, SEEK_SET);
    size_t n = fread(buf, 1, DUMP_TAIL_BYTES, f);
    fclose(f);
    buf[n] = '\0';
    size_t end = n;
    while (end && buf[end - 1] == '\n') end--; /* ignore the final newline */
    size_t from = end;
    int lines = 0;
    while (from > 0) {
        if (buf[from - 1] == '\n' && ++lines == max_lines) break;
        from--;
    }
    fprintf(stderr, "[%s] ---- last lines of %s ----\n", p->name, p->log_path);
    for (size_t i = from; i < end;) {
        const char *nl = memchr(buf + i, '\n', end - i);
        size_t len = nl ? (size_t)(nl - (buf + i)) : end - i;
        fprintf(stderr, "[%s] %.*s\n", p->name, (int)len, buf + i);
        i += len + 1;
    }
    fprintf(stderr, "[%s] ---- end of log ----\n", p->name);
    kvo_free(buf);
}

/* ---- Ports and readiness ------------------------------------------------- */

kvo_status kvo_free_port(uint16_t *port) {
    if (!port) return KVO_EINVAL;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return KVO_ENET;
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    kvo_status st = KVO_ENET;
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0 && a.sin_port) {
        *port = ntohs(a.sin_port);
        st = KVO_OK;
    }
    close(fd);
    return st;
}

/* One non-blocking connect attempt bounded by wait_ms; true on success. */
static bool tcp_try(const struct addrinfo *ai, long wait_ms) {
    int fd =
        socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
               ai->ai_protocol);
    if (fd < 0) return false;
    bool ok = false;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
        ok = true;
    } else if (errno == EINPROGRESS) {
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        if (poll(&pfd, 1, (int)wait_ms) == 1) {
            int err = 0;
            socklen_t len = sizeof(err);
            ok = getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 &&
                 err == 0;
        }
    }
    close(fd);
    return ok;
}

/* Tries ready(ctx, wait_ms) until it answers KVO_OK, the child dies
 * (KVO_ESTATE) or timeout_ms passes (KVO_ETIMEDOUT), sleeping
 * POLL_SLEEP_MS between tries; KVO_EAGAIN = not yet, anything else gives
 * up with that status. wait_ms is what is left, at least 1. */
static kvo_status poll_ready(kvo_proc *p, long timeout_ms,
                             kvo_status (*ready)(void *ctx, long wait_ms),
                             void *ctx) {
    uint64_t deadline = deadline_in(timeout_ms);
    for (;;) {
        if (p && !kvo_proc_alive(p)) return KVO_ESTATE;
        long left = ms_left(deadline);
        kvo_status st = ready(ctx, left > 0 ? left : 1);
        if (st != KVO_EAGAIN) return st;
        left = ms_left(deadline);
        if (left == 0) return KVO_ETIMEDOUT;
        kvo_sleep_us((left < POLL_SLEEP_MS ? left : POLL_SLEEP_MS) * 1000L);
    }
}

/* Something accepts on one of the addresses (each try up to 200 ms). */
static kvo_status tcp_ready(void *ctx, long wait_ms) {
    for (const struct addrinfo *a = ctx; a; a = a->ai_next)
        if (tcp_try(a, wait_ms < 200 ? wait_ms : 200)) return KVO_OK;
    return KVO_EAGAIN;
}

kvo_status kvo_wait_tcp(kvo_proc *p, const char *host, uint16_t port,
                        long timeout_ms) {
    char portstr[8];
    snprintf(portstr, sizeof(portstr), "%u", (unsigned)port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC,
                             .ai_socktype = SOCK_STREAM,
                             .ai_flags = AI_NUMERICSERV};
    struct addrinfo *ai = NULL;
    if (getaddrinfo(host ? host : "127.0.0.1", portstr, &hints, &ai) != 0 ||
        !ai)
        return KVO_EINVAL;
    kvo_status st = poll_ready(p, timeout_ms, tcp_ready, ai);
    freeaddrinfo(ai);
    return st;
}

/* GET url answers 200 (each try up to 1 s). A fresh client per try: a
 * half-started server can leave a kept-alive connection in a bad state. */
static kvo_status http_ready(void *ctx, long wait_ms) {
    const char *url = ctx;
    kvo_http_client *c = NULL;
    if (kvo_http_client_new(&c, wait_ms < 1000 ? wait_ms : 1000) != KVO_OK)
        return KVO_EHTTP;
    kvo_http_resp resp;
    kvo_http_resp_init(&resp);
    bool ok = kvo_http_get(c, url, &resp) == KVO_OK && resp.status == 200;
    kvo_http_resp_fini(&resp);
    kvo_http_client_free(c);
    return ok ? KVO_OK : KVO_EAGAIN;
}

kvo_status kvo_wait_http(kvo_proc *p, const char *url, long timeout_ms) {
    return poll_ready(p, timeout_ms, http_ready, (void *)url);
}
