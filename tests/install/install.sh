#!/usr/bin/env bash
# Installs the build to a temporary prefix, then builds a ten-line program
# against the installed codec through pkg-config, statically and shared,
# and checks both decode a wire vector to the same JSON as kvo-wire.
# Usage: install.sh BUILD_DIR SOURCE_DIR [EXTRA_CFLAGS]
set -euo pipefail
build=$1 src=$2 extra=${3:-}
prefix=$(mktemp -d /tmp/kvo-install-XXXXXX)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" >/dev/null
for p in kvo-wire kvo-mocker kvo-relay kvo-indexer kvo-check; do
  [ -x "$prefix/bin/$p" ] || { echo "FAIL: $p not installed"; exit 1; }
done
[ -f "$prefix/share/doc/kvoracle/README.md" ] || { echo "FAIL: no docs"; exit 1; }
pc=$(dirname "$(find "$prefix" -name kvowire.pc)")
export PKG_CONFIG_PATH="$pc"
vector="$src/tests/data/vectors/wire/$(cd "$src/tests/data/vectors/wire" && ls *.bin | head -n 1)"
want=$("$prefix/bin/kvo-wire" decode "$vector" | tr -d ' \n')
cc=${CC:-cc}
"$cc" $extra -o "$prefix/decode-shared" "$src/tests/install/decode.c" \
  $(pkg-config --cflags --libs kvowire)
"$cc" $extra -o "$prefix/decode-static" "$src/tests/install/decode.c" \
  $(pkg-config --cflags kvowire) -Wl,-Bstatic $(pkg-config --libs-only-L kvowire) \
  -lkvowire -Wl,-Bdynamic $(pkg-config --static --libs kvowire | sed 's/-lkvowire//')
for kind in shared static; do
  got=$(LD_LIBRARY_PATH="$(pkg-config --variable=libdir kvowire)" \
        "$prefix/decode-$kind" "$vector" | tr -d ' \n')
  if [ "$got" != "$want" ]; then
    echo "FAIL: $kind decode differs from kvo-wire"
    echo " want $want"; echo " got  $got"; exit 1
  fi
done
echo "installed to a temporary prefix; the codec builds and decodes through pkg-config (shared and static)"
