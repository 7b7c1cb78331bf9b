# Sourced by the sweep scripts before anything runs: their arguments are directories, so -h or
# --help prints the script's header comment (its usage) and exits 0, and any other option is
# refused with exit 2; either way nothing is created or run.
for argument in "$@"; do
    if [[ $argument == -h || $argument == --help ]]; then
        sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
        exit 0
    elif [[ $argument == -* ]]; then
        echo "$(basename "$0"): unknown option '$argument'; the arguments are directories." \
            "Nothing was run." >&2
        exit 2
    fi
done
