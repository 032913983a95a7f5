#!/usr/bin/env bash
# Runs a command that must fail in a specific way: exit code CODE and output (stdout + stderr)
# matching the extended regex PATTERN. Used instead of CTest's WILL_FAIL, which passes on any
# failure, a crash included.
#   expect_exit.sh CODE PATTERN command [args...]
set -u
code="$1"; pattern="$2"; shift 2
out="$("$@" 2>&1)"
rc=$?
printf '%s\n' "$out"
if [ "$rc" -ne "$code" ]; then
  echo "expect_exit: exit code $rc, expected $code" >&2
  exit 1
fi
if ! printf '%s\n' "$out" | grep -Eq -- "$pattern"; then
  echo "expect_exit: output does not match /$pattern/" >&2
  exit 1
fi
echo "expect_exit: exit code $code and /$pattern/ as expected"
