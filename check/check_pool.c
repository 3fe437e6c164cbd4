/* check_pool.c -- a few persistent threads that run one batch of tasks at
 * a time, so the driver's independent HTTP calls overlap (the probes of the
 * next prompt while the watermark is awaited; the index query while the
 * counters are read). Tasks only talk HTTP through their own clients and
 * write their own result slots; everything they produce is merged by the
 * caller after chk_pool_run returns.
 *
 *   caller: chk_pool_run(tasks)  -> wakes the workers, runs tasks itself
 *                                   too, returns when every task is done
 *   worker: sleep on `go` -> grab the next task index -> run -> count
 */
#include "check_int.h"

#include <pthread.h>
#include <string.h>

struct chk_pool {
    pthread_t *threads;
    int n_threads;
    pthread_mutex_t mu;
    pthread_cond_t go, done;
    chk_task *const *tasks;
    size_t n_tasks, next, finished;
    uint64_t generation;
    bool quit;
};

/* Next task of the current batch, or NULL; called with mu held. */
static chk_task *grab(chk_pool *p) {
    return p->next < p->n_tasks ? p->tasks[p->next++] : NULL;
}

static void run_some(chk_pool *p) {
    pthread_mutex_lock(&p->mu);
    for (chk_task *t; (t = grab(p)) != NULL;) {
        pthread_mutex_unlock(&p->mu);
        t->fn(t);
        pthread_mutex_lock(&p->mu);
        if (++p->finished == p->n_tasks) pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
}

static void *worker(void *arg) {
    chk_pool *p = arg;
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (!p->quit && p->generation == seen)
            pthread_cond_wait(&p->go, &p->mu);
        bool quit = p->quit;
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        if (quit) return NULL;
        run_some(p);
    }
}

kvo_status chk_pool_new(chk_pool **out, int threads) {
    chk_pool *p = kvo_calloc(1, sizeof(*p));
    if (!p) return KVO_ENOMEM;
    if (threads < 0) threads = 0;
    p->threads = kvo_calloc((size_t)threads + 1, sizeof(pthread_t));
    if (!p->threads) {
        kvo_free(p);
        return KVO_ENOMEM;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->go, NULL);
    pthread_cond_init(&p->done, NULL);
    for (int i = 0; i < threads; i++) {
        if (pthread_create(&p->threads[i], NULL, worker, p) != 0) break;
        p->n_threads++;
    }
    *out = p;
    return KVO_OK;
}

void chk_pool_free(chk_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->quit = true;
    pthread_cond_broadcast(&p->go);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n_threads; i++) pthread_join(p->threads[i], NULL);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->go);
    pthread_cond_destroy(&p->done);
    kvo_free(p->threads);
    kvo_free(p);
}

void chk_pool_run(chk_pool *p, chk_task *const *tasks, size_t n) {
    if (n == 0) return;
    if (!p || p->n_threads == 0 || n == 1) {
        for (size_t i = 0; i < n; i++) tasks[i]->fn(tasks[i]);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->tasks = tasks;
    p->n_tasks = n;
    p->next = 0;
    p->finished = 0;
    p->generation++;
    /* wake only as many workers as there are tasks beside the caller's
     * (any other would find nothing to grab) */
    for (size_t k = 1; k < n && k <= (size_t)p->n_threads; k++)
        pthread_cond_signal(&p->go);
    pthread_mutex_unlock(&p->mu);
    run_some(p);
    pthread_mutex_lock(&p->mu);
    while (p->finished < p->n_tasks) pthread_cond_wait(&p->done, &p->mu);
    p->tasks = NULL;
    p->n_tasks = 0;
    pthread_mutex_unlock(&p->mu);
}
