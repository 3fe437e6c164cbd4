/* kvo_proc.h -- child processes for kvo-check --spawn and the end-to-end
 * tests: spawn with a log file, poll for readiness, stop what we started.
 */
#ifndef KVO_PROC_H
#define KVO_PROC_H

#include "kvo.h"

#include <sys/types.h>

typedef struct kvo_proc {
    pid_t pid;          /* 0 = not running */
    char name[64];      /* for messages: "kvo-relay[0]" */
    char log_path[512]; /* stdout+stderr of the child */
    int exit_status;    /* after it ended: exit code, or 128+signal */
    bool exited;
    bool killed; /* kvo_proc_stop had to SIGKILL it: it outlived the
                           grace after SIGTERM */
} kvo_proc;

/* Start argv[0] (searched in PATH if it has no '/') with stdout and stderr
 * appended to log_path. The child gets its own process group and dies with
 * its parent (PR_SET_PDEATHSIG). */
kvo_status kvo_proc_spawn(kvo_proc *p, const char *name, char *const argv[],
                          const char *log_path);
/* true while the child runs; reaps it (and fills exit_status) once it ends. */
bool kvo_proc_alive(kvo_proc *p);
/* SIGTERM, wait up to grace_ms, then SIGKILL; reaps. No-op if not running.
 * p->killed tells whether the SIGKILL was needed. */
void kvo_proc_stop(kvo_proc *p, long grace_ms);
/* SIGKILL at once, reaps (crash injection). */
void kvo_proc_kill(kvo_proc *p);
/* Copy the last max_lines lines of the log to stderr, prefixed by name. */
void kvo_proc_dump_log(const kvo_proc *p, int max_lines);

/* A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0). */
kvo_status kvo_free_port(uint16_t *port);
/* Poll until something accepts TCP connections on host:port or the child
 * dies or timeout_ms passes (KVO_ETIMEDOUT / KVO_ESTATE). p may be NULL. */
kvo_status kvo_wait_tcp(kvo_proc *p, const char *host, uint16_t port,
                        long timeout_ms);
/* Poll until GET url answers 200 (same failure rules). */
kvo_status kvo_wait_http(kvo_proc *p, const char *url, long timeout_ms);
/* Find an executable: PATH, then /usr/sbin, /usr/local/sbin, /sbin.
 * Writes the full path to out; KVO_ENOTFOUND when missing. */
kvo_status kvo_find_exe(const char *name, char *out, size_t outsz);

#endif /* KVO_PROC_H */
