/* mock_text.c -- the mock tokenizer, detokenizer and chat template.
 *
 * Tokenizer: one token per byte of the UTF-8 text, token id = byte value
 * (0..255). Deterministic, needs no vocabulary file, and a shared text
 * prefix is always a shared token prefix (what prefix caching keys on).
 * Generated tokens (ids in 0..31999) read back as " t<id>" each.
 * Chat template: "<|role|>\n" + content + "\n" per message, then
 * "<|assistant|>\n" (the generation prompt).
 */
#include "mock_int.h"

#include <string.h>

uint32_t mock_tokenize(const char *text, size_t len, uint64_t *out) {
    for (size_t i = 0; i < len; i++) out[i] = (uint8_t)text[i];
    return (uint32_t)len;
}

kvo_status mock_detokenize(const uint64_t *tokens, uint32_t n, kvo_buf *b) {
    for (uint32_t i = 0; i < n; i++) { /* " t<decimal>", without printf */
        char tmp[24];                  /* " t" and at most 20 digits */
        int k = (int)sizeof(tmp);
        uint64_t v = tokens[i];
        do {
            tmp[--k] = (char)('0' + v % 10);
            v /= 10;
        } while (v);
        tmp[--k] = 't';
        tmp[--k] = ' ';
        kvo_status st = kvo_buf_append(b, tmp + k, sizeof(tmp) - (size_t)k);
        if (st != KVO_OK) return st;
    }
    return KVO_OK;
}

kvo_status mock_chat_template(const kvo_jv *messages, kvo_buf *b) {
    if (!kvo_json_is(messages, KVO_JSON_ARR)) return KVO_EINVAL;
    for (size_t i = 0; i < messages->len; i++) {
        kvo_jv m;
        kvo_json_at(messages, i, &m);
        size_t rlen;
        const char *role = kvo_json_str(kvo_json_get(&m, "role"), &rlen);
        if (!role) return KVO_EINVAL;
        kvo_status st;
        if ((st = kvo_buf_append(b, "<|", 2)) != KVO_OK ||
            (st = kvo_buf_append(b, role, rlen)) != KVO_OK ||
            (st = kvo_buf_append(b, "|>\n", 3)) != KVO_OK)
            return st;
        const kvo_jv *content = kvo_json_get(&m, "content");
        if (kvo_json_is(content, KVO_JSON_STR)) {
            st = kvo_buf_append(b, content->v.s, content->len);
        } else if (kvo_json_is(content, KVO_JSON_ARR)) {
            /* OpenAI content parts: the text parts, concatenated. */
            for (size_t j = 0; j < content->len && st == KVO_OK; j++) {
                kvo_jv part;
                kvo_json_at(content, j, &part);
                size_t tlen;
                const char *txt =
                    kvo_json_str(kvo_json_get(&part, "text"), &tlen);
                if (txt) st = kvo_buf_append(b, txt, tlen);
            }
        } else if (content && !kvo_json_is(content, KVO_JSON_NULL)) {
            return KVO_EINVAL;
        }
        if (st != KVO_OK) return st;
        if ((st = kvo_buf_append(b, "\n", 1)) != KVO_OK) return st;
    }
    return kvo_buf_append(b, "<|assistant|>\n", 14);
}
