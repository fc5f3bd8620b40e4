#!/bin/sh
# node-problem-detector custom plugin (docs/kubernetes.md, "A Node condition for shared-memory pressure"):
# is shared memory on this node used above a threshold?
#
#   triton-shm-pressure.sh dir DIRECTORY [PERCENT]   the filesystem of DIRECTORY (the node's /dev/shm, mounted into
#                                                    node-problem-detector's pod), by df
#   triton-shm-pressure.sh metrics DIRECTORY [PERCENT]  the fullest /dev/shm of the Triton servers that tritonops.shm's
#                                                    report, cleanup or node agent describe in DIRECTORY's textfile
#                                                    metrics (tritonops_shm_fs_used_bytes / tritonops_shm_fs_size_bytes)
#
# PERCENT defaults to 90. Exit status as node-problem-detector reads it: 0 below PERCENT, 1 at or above it (the
# condition TritonShmPressure is set), 2 unknown (no such directory, nothing to read, a bad argument). One line on
# stdout becomes the condition's message. POSIX sh, df -P and awk only.
mode=${1:-}
dir=${2:-}
threshold=${3:-90}

unknown() {
    echo "$*"
    exit 2
}

case $threshold in
    '' | *[!0-9]*) unknown "threshold '$threshold' is not a whole percent" ;;
esac
[ "$threshold" -le 100 ] || unknown "threshold $threshold is above 100"
[ -n "$dir" ] || unknown "usage: $0 dir|metrics DIRECTORY [PERCENT]"
if [ ! -d "$dir" ] || [ ! -r "$dir" ]; then unknown "$dir: not a readable directory"; fi

case $mode in
    dir)
        # POSIX df -P: one line per filesystem, 1024-byte blocks: total, used
        read -r size used <<EOF
$(df -P -k "$dir" 2>/dev/null | awk 'NR == 2 { print $2, $3 }')
EOF
        [ -n "$used" ] || unknown "df -P $dir gave no answer"
        what=$dir
        ;;
    metrics)
        # the fullest server: "used size url" (bytes), from every tritonops_shm*.prom file of the directory
        read -r used size url <<EOF
$(cat "$dir"/tritonops_shm*.prom 2>/dev/null | awk '
            /^tritonops_shm_fs_(used|size)_bytes[{ ]/ {
                name = $1; sub(/\{.*/, "", name)
                key = $1; sub(/^[^{]*/, "", key)
                url = key; if (!sub(/.*triton_url="/, "", url)) url = "?"; sub(/".*/, "", url)
                if (name == "tritonops_shm_fs_used_bytes") used[key] = $NF + 0; else size[key] = $NF + 0
                urls[key] = url
            }
            END {
                best = -1
                for (k in size) if ((k in used) && size[k] > 0 && used[k] / size[k] > best) {
                    best = used[k] / size[k]; line = sprintf("%.0f %.0f %s", used[k], size[k], urls[k])
                }
                if (best >= 0) print line
            }')
EOF
        [ -n "$url" ] || unknown "no tritonops_shm_fs_used_bytes and _size_bytes in $dir/tritonops_shm*.prom"
        what="Triton $url /dev/shm"
        ;;
    *) unknown "usage: $0 dir|metrics DIRECTORY [PERCENT]" ;;
esac

case $size$used in
    *[!0-9]*) unknown "$what: size '$size' and used '$used' are not whole numbers" ;;
esac
[ "$size" -gt 0 ] || unknown "$what: size 0"
percent=$(awk -v u="$used" -v s="$size" 'BEGIN { printf "%d", u * 100 / s }')
if [ "$percent" -ge "$threshold" ]; then
    echo "$what is ${percent}% used (threshold ${threshold}%)"
    exit 1
fi
echo "$what is ${percent}% used (below ${threshold}%)"
exit 0
