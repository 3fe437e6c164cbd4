/* Replays the fuzzing corpus and every crash file found so far through the
 * fuzz targets' own checks (tests/fuzz/fuzz_batch.c, fuzz_plane.c), in
 * every ordinary build: a crash once found stays fixed. */
#include "kt.h"
#include "wire.h"

#include <string.h>

#define KVO_FUZZ_REPLAY
#include "../fuzz/fuzz_batch.c"
#undef FUZZ_CHECK
#include "../fuzz/fuzz_plane.c"

Suite *suite_fuzz_replay(void);

START_TEST(batch_corpus_and_crashes_replay_cleanly) {
    size_t n = kt_fuzz_replay("corpus/batch", kvo_fuzz_batch);
    ck_assert_uint_ge(n, 31); /* at least the wire vectors */
    kt_fuzz_replay("crashes/batch", kvo_fuzz_batch);
}
END_TEST

START_TEST(plane_corpus_and_crashes_replay_cleanly) {
    size_t n = kt_fuzz_replay("corpus/plane", kvo_fuzz_plane);
    ck_assert_uint_ge(n, 5); /* at least the event-plane vectors */
    kt_fuzz_replay("crashes/plane", kvo_fuzz_plane);
}
END_TEST

START_TEST(the_fuzz_checks_can_fail) {
    /* A replay that cannot fail proves nothing: feed the batch check a
     * decodable payload and break one of its invariants by hand. */
    wire_batch b;
    wire_batch_init(&b);
    const uint8_t cleared[] = {0x93, 0xcb, 0x3f, 0xf0, 0,    0,   0,   0,
                               0,    0,    0x91, 0x91, 0xb0, 'A', 'l', 'l',
                               'B',  'l',  'o',  'c',  'k',  's', 'C', 'l',
                               'e',  'a',  'r',  'e',  'd',  0xc0};
    ck_assert(wire_batch_decode(cleared, sizeof(cleared), NULL, &b, NULL) ==
              KVO_OK);
    wire_batch other;
    wire_batch_init(&other);
    ck_assert(wire_batch_decode(cleared, sizeof(cleared), NULL, &other, NULL) ==
              KVO_OK);
    ck_assert(same_content(&b, &other, true));
    other.events[0].type = WIRE_EV_REMOVED;
    ck_assert(!same_content(&b, &other, true));
    other.events[0].type = WIRE_EV_CLEARED;
    other.dp_rank.set = true;
    ck_assert(!same_content(&b, &other, true));
    ck_assert(same_content(&b, &other, false));
    wire_batch_fini(&other);
    wire_batch_fini(&b);
    kvo_fuzz_batch(cleared, sizeof(cleared));
}
END_TEST

Suite *suite_fuzz_replay(void) {
    Suite *s = suite_create("fuzz_replay");
    TCase *tc = tcase_create("fuzz_replay");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, batch_corpus_and_crashes_replay_cleanly);
    tcase_add_test(tc, plane_corpus_and_crashes_replay_cleanly);
    tcase_add_test(tc, the_fuzz_checks_can_fail);
    suite_add_tcase(s, tc);
    return s;
}
