/* test_cfg: the --nats* options (table, setter, usage text, environment)
 * and the configuration check, without a server. */
#include "kt.h"
#include "kvo_nats.h"

#include <stdlib.h>
#include <string.h>

Suite *suite_cfg(void);

static const struct option table[] = {KVO_NATS_OPTIONS, {NULL, 0, NULL, 0}};

/* The field an option sets, as text ("1" for a set flag, "" for unset). */
static const char *field(const kvo_nats_cfg *c, int code, char *buf, size_t n) {
    switch (code) {
    case KVO_NATS_OPT_URL: return c->url;
    case KVO_NATS_OPT_USER: return c->user;
    case KVO_NATS_OPT_PASSWORD: return c->password;
    case KVO_NATS_OPT_TOKEN: return c->token;
    case KVO_NATS_OPT_CREDS: return c->creds;
    case KVO_NATS_OPT_TLS: return c->tls ? "1" : "";
    case KVO_NATS_OPT_TLS_CA: return c->tls_ca;
    case KVO_NATS_OPT_TLS_CERT: return c->tls_cert;
    case KVO_NATS_OPT_TLS_KEY: return c->tls_key;
    case KVO_NATS_OPT_TLS_SKIP_VERIFY: return c->tls_skip_verify ? "1" : "";
    case KVO_NATS_OPT_RECONNECT_WAIT:
        snprintf(buf, n, "%d", c->reconnect_wait_ms);
        return buf;
    }
    ck_abort_msg("no field for option code %d", code);
    return NULL;
}

/* Every entry of the table: named by kvo_nats_opt_name, shown in the usage
 * text, and sets its own field (and only that one). */
START_TEST(every_option_is_named_documented_and_sets_its_field) {
    size_t n = 0;
    for (const struct option *o = table; o->name; o++, n++) {
        ck_assert_str_eq(kvo_nats_opt_name(o->val), o->name);
        char flag[64];
        snprintf(flag, sizeof(flag), "--%s ", o->name);
        ck_assert_msg(strstr(KVO_NATS_USAGE, flag), "%s not in the usage",
                      o->name);
        const char *arg = o->has_arg == no_argument               ? NULL
                          : o->val == KVO_NATS_OPT_RECONNECT_WAIT ? "75"
                                                                  : "value";
        kvo_nats_cfg c, before;
        kvo_nats_cfg_default(&c);
        before = c;
        ck_assert_int_eq(kvo_nats_opt_set(&c, o->val, arg), KVO_NATS_OPT_OK);
        for (const struct option *p = table; p->name; p++) {
            char b1[16], b2[16];
            const char *now = field(&c, p->val, b1, sizeof(b1));
            const char *was = field(&before, p->val, b2, sizeof(b2));
            bool changed = (now == NULL) != (was == NULL) ||
                           (now && strcmp(now, was) != 0);
            ck_assert_msg(changed == (p == o), "--%s changed %s", o->name,
                          p->name);
        }
        char b[16];
        ck_assert_str_eq(field(&c, o->val, b, sizeof(b)), arg ? arg : "1");
    }
    ck_assert_uint_eq(n, 11);
    ck_assert_ptr_null(kvo_nats_opt_name(256));
}
END_TEST

START_TEST(other_codes_and_bad_numbers_are_told_apart) {
    kvo_nats_cfg c;
    kvo_nats_cfg_default(&c);
    ck_assert_int_eq(kvo_nats_opt_set(&c, 256, "x"), KVO_NATS_OPT_OTHER);
    ck_assert_int_eq(kvo_nats_opt_set(&c, 'h', NULL), KVO_NATS_OPT_OTHER);
    const char *bad[] = {"", "abc", "-1", "2147483648", "10ms"};
    for (size_t i = 0; i < KVO_ARRAY_LEN(bad); i++)
        ck_assert_int_eq(
            kvo_nats_opt_set(&c, KVO_NATS_OPT_RECONNECT_WAIT, bad[i]),
            KVO_NATS_OPT_BAD);
    ck_assert_int_eq(c.reconnect_wait_ms, 250);
    ck_assert_int_eq(
        kvo_nats_opt_set(&c, KVO_NATS_OPT_RECONNECT_WAIT, "2147483647"),
        KVO_NATS_OPT_OK);
    ck_assert_int_eq(c.reconnect_wait_ms, 2147483647);
}
END_TEST

static kvo_status set_cfg(void *ctx, int code, const char *arg) {
    return kvo_nats_opt_set(ctx, code, arg) == KVO_NATS_OPT_OK ? KVO_OK : -1;
}

/* kvo_getopt over the shared table: KVO_NATS_* from the environment first,
 * the command line over them. (Check forks each test: setenv stays here.) */
START_TEST(command_line_and_environment_fill_the_cfg) {
    setenv("KVO_NATS_USER", "env-user", 1);
    setenv("KVO_NATS_TOKEN", "env-token", 1);
    setenv("KVO_NATS_TLS", "1", 1);
    setenv("KVO_NATS_TLS_SKIP_VERIFY", "0", 1); /* "0": flag stays off */
    setenv("KVO_NATS_RECONNECT_WAIT_MS", "40", 1);
    char *argv[] = {"prog",        "--nats",        "nats://a:1,nats://b:2",
                    "--nats-user", "cli-user",      "--nats-password",
                    "pw",          "--nats-tls-ca", "/ca.pem",
                    NULL};
    kvo_nats_cfg c;
    kvo_nats_cfg_default(&c);
    ck_assert_int_eq(kvo_getopt(9, argv, table, set_cfg, &c), 9);
    ck_assert_str_eq(c.url, "nats://a:1,nats://b:2");
    ck_assert_str_eq(c.user, "cli-user");
    ck_assert_str_eq(c.password, "pw");
    ck_assert_str_eq(c.token, "env-token");
    ck_assert_str_eq(c.tls_ca, "/ca.pem");
    ck_assert(c.tls);
    ck_assert(!c.tls_skip_verify);
    ck_assert_int_eq(c.reconnect_wait_ms, 40);
    setenv("KVO_NATS_RECONNECT_WAIT_MS", "soon", 1);
    kvo_nats_cfg_default(&c);
    ck_assert_int_eq(kvo_getopt(1, argv, table, set_cfg, &c), -1);
}
END_TEST

START_TEST(cfg_check_wants_paired_credentials_and_a_server) {
    char err[128];
    kvo_nats_cfg c;
    kvo_nats_cfg_default(&c);
    ck_assert_str_eq(c.url, "nats://127.0.0.1:4222");
    ck_assert_int_eq(c.reconnect_wait_ms, 250);
    ck_assert_int_eq(c.buffer_bytes, 0);
    ck_assert_int_eq(kvo_nats_cfg_check(&c, err, sizeof(err)), KVO_OK);
    c.user = "u";
    ck_assert_int_eq(kvo_nats_cfg_check(&c, err, sizeof(err)), KVO_EINVAL);
    ck_assert_str_eq(err, "--nats-user and --nats-password go together");
    c.user = NULL;
    c.password = "p";
    ck_assert_int_eq(kvo_nats_cfg_check(&c, err, sizeof(err)), KVO_EINVAL);
    c.user = "u";
    ck_assert_int_eq(kvo_nats_cfg_check(&c, err, sizeof(err)), KVO_OK);
    const char *none[] = {"", ",", " , ,, ", "  "};
    for (size_t i = 0; i < KVO_ARRAY_LEN(none); i++) {
        c.url = none[i];
        ck_assert_int_eq(kvo_nats_cfg_check(&c, err, sizeof(err)), KVO_EINVAL);
        ck_assert_ptr_nonnull(strstr(err, "no server URL"));
    }
    c.url = " nats://a:1, ,nats://b:2,";
    ck_assert_int_eq(kvo_nats_cfg_check(&c, err, sizeof(err)), KVO_OK);
}
END_TEST

START_TEST(auth_and_tls_are_described_for_the_log) {
    kvo_nats_cfg c;
    kvo_nats_cfg_default(&c);
    ck_assert_str_eq(kvo_nats_cfg_auth(&c), "none");
    ck_assert_str_eq(kvo_nats_cfg_tls(&c), "off");
    c.user = "u";
    ck_assert_str_eq(kvo_nats_cfg_auth(&c), "user");
    c.token = "t";
    ck_assert_str_eq(kvo_nats_cfg_auth(&c), "token");
    c.creds = "/f";
    ck_assert_str_eq(kvo_nats_cfg_auth(&c), "creds");
    c.tls_cert = "/c";
    ck_assert_str_eq(kvo_nats_cfg_tls(&c), "on");
    c.tls_cert = NULL;
    c.tls_skip_verify = true;
    ck_assert_str_eq(kvo_nats_cfg_tls(&c), "on (no verify)");
}
END_TEST

Suite *suite_cfg(void) {
    Suite *s = suite_create("cfg");
    TCase *tc = tcase_create("options");
    tcase_add_test(tc, every_option_is_named_documented_and_sets_its_field);
    tcase_add_test(tc, other_codes_and_bad_numbers_are_told_apart);
    tcase_add_test(tc, command_line_and_environment_fill_the_cfg);
    tcase_add_test(tc, cfg_check_wants_paired_credentials_and_a_server);
    tcase_add_test(tc, auth_and_tls_are_described_for_the_log);
    suite_add_tcase(s, tc);
    return s;
}
