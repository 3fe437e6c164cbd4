/* Embeds the installed codec: decodes one KVEventBatch payload (a file)
 * and prints its JSON view. Built against the installed headers and
 * library through pkg-config by tests/install/install.sh. */
#include <wire.h>
#include <stdio.h>

int main(int argc, char **argv) {
    static uint8_t buf[1 << 20];
    FILE *f = argc > 1 ? fopen(argv[1], "rb") : NULL;
    size_t n = f ? fread(buf, 1, sizeof(buf), f) : 0;
    if (f) fclose(f);
    wire_batch b;
    wire_batch_init(&b);
    json_object *view = NULL;
    if (wire_batch_decode(buf, n, NULL, &b, NULL) == KVO_OK &&
        wire_batch_to_json(&b, &view) == KVO_OK)
        puts(json_object_to_json_string(view));
    json_object_put(view);
    wire_batch_fini(&b);
    return view ? 0 : 1;
}
