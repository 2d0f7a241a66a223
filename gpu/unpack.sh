#!/bin/bash
# bash gpu/unpack.sh DIR...: the STAGE.tar.gz files gpu/prove.sh left in $OUT on the H200
# machine (fetched into DIR, one or more folders) -> tests/data/gpu/$PROVE_DATE/STAGE/
# (PROVE_DATE default 2026-12-03), keeping only what is worth committing: the JSON
# reports, the certify JUnit/SARIF, calls.jsonl, summary.log, facts.txt, console's plain
# table, per run directory meta.json, ledger/*.json and events/*.jsonl; the stderr of each
# call (last 100 KB) and each server.log (last 300 KB) trimmed. Total kept under ~3 MB:
# when over 2.8 MB the server logs are cut to 100 KB, then the stderr files to 30 KB.
# A stage unpacked again replaces its folder. Run from anywhere; prints what it kept.
set -eu
[ $# -ge 1 ] || {
    echo "usage: bash gpu/unpack.sh DIR... (folders holding STAGE.tar.gz from gpu/prove.sh)" >&2
    exit 2
}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
DEST=$ROOT/tests/data/gpu/${PROVE_DATE:-2026-12-03}
LIMIT=$((2800 * 1024))
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$DEST"

found=0
for dir in "$@"; do
    for tgz in "$dir"/*.tar.gz; do
        [ -f "$tgz" ] || continue
        stage=$(basename "$tgz" .tar.gz)
        case "$stage" in facts | serve | checks | lora | certify | recovery | recovery2 | images | images2 | hang | uuid | fidelity) ;; *)
            echo "skipping $tgz: not a gpu/prove.sh stage" >&2
            continue
            ;;
        esac
        found=$((found + 1))
        rm -rf "${TMP:?}/$stage"
        tar -xzf "$tgz" -C "$TMP"
        src=$TMP/$stage
        dst=$DEST/$stage
        rm -rf "$dst"
        mkdir -p "$dst"
        (cd "$src" && find . -type f \( -name '*.json' -o -name '*.jsonl' -o -name '*.xml' \
            -o -name '*.sarif' -o -name '*.txt' -o -name 'summary.log' \) | sort) |
            while read -r f; do
                mkdir -p "$dst/$(dirname "$f")"
                cp "$src/$f" "$dst/$f"
            done
        (cd "$src" && find . -type f -name '*.err' | sort) | while read -r f; do
            tail -c 100000 "$src/$f" >"$dst/$f"
        done
        (cd "$src" && find . -type f -name 'server.log' | sort) | while read -r f; do
            mkdir -p "$dst/$(dirname "$f")"
            tail -c 300000 "$src/$f" >"$dst/$f"
        done
        echo "$stage: $(find "$dst" -type f | wc -l) files, $(du -sh "$dst" | cut -f1) <- $tgz"
    done
done
[ "$found" -gt 0 ] || {
    echo "no gpu/prove.sh stage tar.gz in: $*" >&2
    exit 1
}

size() { du -sb "$DEST" | cut -f1; }
if [ "$(size)" -gt "$LIMIT" ]; then
    echo "over 2.8 MB ($(size) bytes): server logs cut to their last 100 KB"
    find "$DEST" -name server.log | while read -r f; do
        tail -c 100000 "$f" >"$f.cut" && mv "$f.cut" "$f"
    done
fi
if [ "$(size)" -gt "$LIMIT" ]; then
    echo "still over 2.8 MB ($(size) bytes): stderr files cut to their last 30 KB"
    find "$DEST" -name '*.err' | while read -r f; do
        tail -c 30000 "$f" >"$f.cut" && mv "$f.cut" "$f"
    done
fi
echo "total $(size) bytes in $DEST"
[ "$(size)" -le "$LIMIT" ] || echo "WARNING: still over 2.8 MB: trim by hand before committing" >&2
find "$DEST" -maxdepth 2 -type f -name '*.json' | sort | sed "s|$ROOT/||"
