#!/usr/bin/env bash
# tools/check_layers.sh: fail when a library folder includes a header of a
# folder above it, or a system library it should not see (tools/layers.txt).
set -euo pipefail
cd "$(dirname "$0")/.."
declare -A allowed libs
while IFS= read -r line; do
  line=${line%%#*}
  [[ "$line" =~ ^[[:space:]]*$ ]] && continue
  folder=${line%%:*}
  rest=${line#*:}
  dirs=${rest%%|*}
  l=""
  [[ "$rest" == *"|"* ]] && l=${rest#*|}
  allowed[$folder]=" $(echo $dirs) $folder "
  libs[$folder]=" $(echo $l) "
done < tools/layers.txt
# System headers that belong to a library, by prefix.
lib_of() {
  case "$1" in
    uv.h|uv/*) echo uv ;;
    msgpack.h|msgpack/*) echo msgpack ;;
    mimalloc.h|mimalloc/*) echo mimalloc ;;
    cuda*.h|cuda/*|cuda_runtime*) echo cuda ;;
    infiniband/*|rdma/*) echo verbs ;;
    *) echo "" ;;
  esac
}
bad=0
for folder in "${!allowed[@]}"; do
  [ -d "$folder" ] || continue
  while IFS= read -r f; do
    while IFS= read -r inc; do
      if [[ "$inc" =~ ^\#[[:space:]]*include[[:space:]]*\"([a-z_]+)/ ]]; then
        dep=${BASH_REMATCH[1]}
        if [[ "${allowed[$folder]}" != *" $dep "* ]]; then
          echo "layers: $f includes a header of $dep/ (allowed for $folder/:${allowed[$folder]})"
          bad=1
        fi
      elif [[ "$inc" =~ ^\#[[:space:]]*include[[:space:]]*\<([^>]+)\> ]]; then
        lib=$(lib_of "${BASH_REMATCH[1]}")
        if [ -n "$lib" ] && [[ "${libs[$folder]}" != *" $lib "* ]]; then
          echo "layers: $f includes <${BASH_REMATCH[1]}>: $folder/ may not see $lib"
          bad=1
        fi
      fi
    done < <(grep -E '^#[[:space:]]*include' "$f" || true)
  done < <(find "$folder" -maxdepth 1 -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' \))
done
if [ $bad -ne 0 ]; then
  echo "layers: see tools/layers.txt for the allowed edges"
  exit 1
fi
echo "layers: every include points down (tools/layers.txt)"
