#!/bin/sh
# GPU reset task of the recovery loop (lambdas/gpu_recovery/recovery/gpu_resets.py): a
# privileged ECS task that holds every GPU of the node resets them and checks them with a
# short DCGM diag. Its exit code is the result the loop reads from the STOPPED event:
#
#   0   the GPUs were reset and the diag passed: the node is healthy again
#   10  a process holds a GPU: nothing was reset ("There can't be any applications using
#       these devices", nvidia-smi man page, -r)
#   11  the driver asks for more than a reset (GPU Recovery Action Reboot or Drain P2P):
#       nothing was reset (a decision taken on XIDs alone did not know this)
#   12  nvidia-smi -r failed
#   13  the diag after the reset failed ("it is recommended that the health of each reset
#       GPU be verified before further use", nvidia-smi man page)
#   14  nvidia-smi could not be queried
#
# Any exit other than 0 makes the loop reboot the node instead. One JSON line on stdout says
# what happened (the task's log). POSIX sh: runs under dash and busybox sh.
#
# All GPUs are reset in one `nvidia-smi -r` (no -i): on NVSwitch systems every GPU of the
# node is then reset together, which NVIDIA's rules for Ampere (Fabric Manager facilitates
# the reset) and Hopper allow; the ranks of the node have all stopped by then (the loop
# waits for them), and this task holds every GPU, so ECS places nothing else meanwhile.
#
# ENV: NVIDIA_SMI, DCGMI (executables), RESET_DIAG_LEVEL 1 or 2 (default 1),
#      DCGM_TIMEOUT (seconds, default 300).

GR_SMI=${NVIDIA_SMI:-nvidia-smi}
GR_DCGMI=${DCGMI:-dcgmi}
GR_TIMEOUT=${DCGM_TIMEOUT:-300}
case ${RESET_DIAG_LEVEL:-1} in
  1|2) GR_LEVEL=${RESET_DIAG_LEVEL:-1} ;;
  *) GR_LEVEL=1; printf 'gpu_reset: invalid RESET_DIAG_LEVEL, using 1\n' >&2 ;;
esac

gr_json_text() {
  # One line, JSON-escaped (backslash, quote, control characters as spaces).
  printf '%s' "$1" | tr '\n\r\t' '   ' | sed 's/\\/\\\\/g; s/"/\\"/g' | cut -c1-400
}

gr_result() {
  # gr_result <result> <exit code> <reason>
  printf '{"result":"%s","exit_code":%s,"diag_level":%s,"reason":"%s","hostname":"%s"}\n' \
    "$1" "$2" "$GR_LEVEL" "$(gr_json_text "$3")" "$(gr_json_text "$(hostname 2>/dev/null)")"
  printf 'gpu_reset: %s: %s\n' "$1" "$3" >&2
  exit "$2"
}

gr_run() {
  # Bounded by DCGM_TIMEOUT where timeout(1) exists (exit 124 when it ran out).
  if command -v timeout >/dev/null 2>&1; then
    timeout "$GR_TIMEOUT" "$@"
  else
    "$@"
  fi
}

# 1. Nothing may hold a GPU.
GR_APPS=$("$GR_SMI" --query-compute-apps=pid,process_name,gpu_uuid --format=csv,noheader 2>&1)
GR_RC=$?
if [ "$GR_RC" -ne 0 ]; then
  gr_result smi_failed 14 "nvidia-smi --query-compute-apps exited $GR_RC: $GR_APPS"
fi
GR_APPS=$(printf '%s\n' "$GR_APPS" | sed '/^[[:space:]]*$/d; /^No running/d')
if [ -n "$GR_APPS" ]; then
  gr_result busy 10 "processes hold a GPU (nothing reset): $GR_APPS"
fi

# 2. The driver's own recovery action: a reset never answers Reboot or Drain P2P.
GR_Q=$("$GR_SMI" -q 2>&1)
GR_RC=$?
if [ "$GR_RC" -ne 0 ]; then
  gr_result smi_failed 14 "nvidia-smi -q exited $GR_RC"
fi
GR_MORE=$(printf '%s\n' "$GR_Q" | sed -n 's/^[[:space:]]*GPU Recovery Action[[:space:]]*:[[:space:]]*//p' \
  | grep -E '^(Reboot|Drain P2P)' | sort -u | tr '\n' ',' | sed 's/,$//')
if [ -n "$GR_MORE" ]; then
  gr_result reboot_required 11 "the driver's GPU Recovery Action is $GR_MORE (nothing reset)"
fi

# 3. Reset every GPU of the node.
GR_OUT=$(gr_run "$GR_SMI" -r 2>&1)
GR_RC=$?
if [ "$GR_RC" -ne 0 ]; then
  gr_result reset_failed 12 "nvidia-smi -r exited $GR_RC: $GR_OUT"
fi

# 4. A short DCGM diag of the reset GPUs.
GR_OUT=$(gr_run "$GR_DCGMI" diag -r "$GR_LEVEL" -j 2>&1)
GR_RC=$?
if [ "$GR_RC" -ne 0 ]; then
  gr_result diag_failed 13 "dcgmi diag -r $GR_LEVEL exited $GR_RC after the reset"
fi
gr_result passed 0 "GPUs reset; dcgmi diag -r $GR_LEVEL passed"
