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
        char tmp[24]; /* " t" and at most 20 digits */
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

kvo_status mock_chat_template(json_object *messages, kvo_buf *b) {
    if (!messages || !json_object_is_type(messages, json_type_array))
        return KVO_EINVAL;
    size_t n = json_object_array_length(messages);
    for (size_t i = 0; i < n; i++) {
        json_object *m = json_object_array_get_idx(messages, i), *role, *content;
        if (!json_object_is_type(m, json_type_object) ||
            !json_object_object_get_ex(m, "role", &role) ||
            !json_object_is_type(role, json_type_string))
            return KVO_EINVAL;
        kvo_status st = kvo_buf_printf(b, "<|%s|>\n", json_object_get_string(role));
        if (st != KVO_OK) return st;
        if (json_object_object_get_ex(m, "content", &content) &&
            !json_object_is_type(content, json_type_null)) {
            if (json_object_is_type(content, json_type_string)) {
                st = kvo_buf_append(b, json_object_get_string(content),
                                    (size_t)json_object_get_string_len(content));
            } else if (json_object_is_type(content, json_type_array)) {
                /* OpenAI content parts: the text parts, concatenated. */
                size_t k = json_object_array_length(content);
                for (size_t j = 0; j < k && st == KVO_OK; j++) {
                    json_object *part = json_object_array_get_idx(content, j), *txt;
                    if (json_object_is_type(part, json_type_object) &&
                        json_object_object_get_ex(part, "text", &txt) &&
                        json_object_is_type(txt, json_type_string))
                        st = kvo_buf_append(b, json_object_get_string(txt),
                                            (size_t)json_object_get_string_len(txt));
                }
            } else {
                return KVO_EINVAL;
            }
            if (st != KVO_OK) return st;
        }
        if ((st = kvo_buf_append(b, "\n", 1)) != KVO_OK) return st;
    }
    return kvo_buf_printf(b, "<|assistant|>\n");
}
