# dcgm_health_check.sh - GPU health check task, run as ["sh", "-c", <this text>] in the DCGM
# image: POSIX sh (dash), no $0; needs awk, sed, hostname, dcgmi, nvidia-smi. Contract, JSON
# fields, environment and sources: health_check/README.md.
# EXIT CODES (the worst wins: 2 > 1 > 4 > 3 > 5 > 0):
#   2 replace: row-remap failure, dcgmi exit 205, or an isolate (2) DCGM error.
#   1 reboot:  any failure a GPU reset is not known to clear (dcgmi failed, ECC with no
#     pending remap or reset request, pages pending retirement, recovery action Reboot/Drain P2P).
#   4 reset:   only pending row remaps / recovery action Reset or Drain and Reset, with
#     their GPUs' uncorrected ECC and reset-severity (6) DCGM errors.
#   3 operator_action: dcgmi failed only on configuration (5) errors.
#   5 inconclusive: the check could not run or evaluate (dcgmi or nvidia-smi missing,
#     dcgmi ran no test, awk failed): no verdict on the GPUs.
#   0 healthy: dcgmi passed and no hardware signal.
# STDOUT: one JSON line, the verdict; everything else goes to stderr.

hc_log() { printf 'dcgm_health_check: %s\n' "$*" >&2; }

DCGMI=${DCGMI:-dcgmi}
NVIDIA_SMI=${NVIDIA_SMI:-nvidia-smi}
HC_LEVEL_RAW=${DCGM_LEVEL:-2}
HC_LEVEL_BAD=0
case "$HC_LEVEL_RAW" in
  1|2|3|4) HC_LEVEL=$HC_LEVEL_RAW ;;
  *) HC_LEVEL=2; HC_LEVEL_BAD=1; hc_log "invalid DCGM_LEVEL, using 2" ;;
esac

HC_SMI_FOUND=0; HC_GPU_RC=127; HC_GPU_OUT=; HC_REMAP_RC=127; HC_REMAP_OUT=; HC_Q_RC=127; HC_Q_OUT=
if command -v "$NVIDIA_SMI" >/dev/null 2>&1; then
  HC_SMI_FOUND=1
  HC_GPU_OUT=$("$NVIDIA_SMI" --query-gpu=index,uuid,ecc.errors.uncorrected.volatile.total --format=csv,noheader,nounits 2>&1)
  HC_GPU_RC=$?
  HC_REMAP_OUT=$("$NVIDIA_SMI" --query-remapped-rows=gpu_uuid,remapped_rows.pending,remapped_rows.failure --format=csv,noheader,nounits)
  HC_REMAP_RC=$?
  # The recovery action is only in -q (R565+): keep the lines the parser reads.
  HC_Q_OUT=$("$NVIDIA_SMI" -q); HC_Q_RC=$?
  HC_Q_OUT=$(printf '%s\n' "$HC_Q_OUT" | sed -n '/^GPU /p;/^    [A-Z][^:]*$/p;/GPU UUID/p;/Recovery Action/p;/Pending/p')
  hc_log "nvidia-smi exit codes: query-gpu $HC_GPU_RC, query-remapped-rows $HC_REMAP_RC, -q $HC_Q_RC"
else
  hc_log "nvidia-smi not found: $NVIDIA_SMI"
fi

HC_DIAG_FOUND=0; HC_DIAG_RC=null; HC_DIAG_OUT=
if command -v "$DCGMI" >/dev/null 2>&1; then
  HC_DIAG_FOUND=1
  hc_log "running: $DCGMI diag -r $HC_LEVEL -j"
  if [ -n "${DCGM_TIMEOUT:-}" ] && command -v timeout >/dev/null 2>&1; then
    HC_DIAG_OUT=$(timeout "$DCGM_TIMEOUT" "$DCGMI" diag -r "$HC_LEVEL" -j)
  else
    HC_DIAG_OUT=$("$DCGMI" diag -r "$HC_LEVEL" -j)
  fi
  HC_DIAG_RC=$?
  hc_log "dcgmi exit code $HC_DIAG_RC"
  printf '%s\n' "$HC_DIAG_OUT" | sed 's/^/dcgmi| /' >&2
else
  hc_log "dcgmi not found: $DCGMI"
fi

# The validation's bounded GPU load: DCGM's stress plugin for LOAD seconds (timeout(1) stops
# it LOAD + 300 s later: exit 124, reboot), parsed with the diag's JSON below.
HC_LOAD=${VALIDATION_LOAD_SECONDS:-0}; HC_LOAD_TEST=${VALIDATION_LOAD_TEST:-targeted_stress}
case "$HC_LOAD" in ''|*[!0-9]*) hc_log "invalid VALIDATION_LOAD_SECONDS, no load"; HC_LOAD=0; HC_LOAD_BAD=1 ;; esac
case "$HC_LOAD_TEST" in *[!a-z_]*) HC_LOAD_TEST=targeted_stress ;; esac
HC_LOAD_RC=0; HC_LOAD_OUT=
if [ "$HC_LOAD" -gt 0 ] && [ "$HC_DIAG_FOUND" = 1 ]; then
  hc_log "running: $DCGMI diag -r $HC_LOAD_TEST -p $HC_LOAD_TEST.test_duration=$HC_LOAD -j"
  if command -v timeout >/dev/null 2>&1; then
    HC_LOAD_OUT=$(timeout $((HC_LOAD + 300)) "$DCGMI" diag -r "$HC_LOAD_TEST" -p "$HC_LOAD_TEST.test_duration=$HC_LOAD" -j)
  else
    HC_LOAD_OUT=$("$DCGMI" diag -r "$HC_LOAD_TEST" -p "$HC_LOAD_TEST.test_duration=$HC_LOAD" -j)
  fi
  HC_LOAD_RC=$?
  hc_log "GPU load exit code $HC_LOAD_RC"
  printf '%s\n' "$HC_LOAD_OUT" | sed 's/^/dcgmi| /' >&2
fi

HC_HOST=$(hostname 2>/dev/null || cat /proc/sys/kernel/hostname 2>/dev/null)
export DCGMI NVIDIA_SMI HC_LEVEL HC_LEVEL_RAW HC_LEVEL_BAD HC_SMI_FOUND HC_GPU_RC \
  HC_GPU_OUT HC_REMAP_RC HC_REMAP_OUT HC_Q_RC HC_Q_OUT HC_DIAG_FOUND HC_DIAG_RC HC_HOST \
  HC_LOAD HC_LOAD_TEST HC_LOAD_RC HC_LOAD_BAD

# The dcgmi output goes through stdin (it can exceed the size limit of one
# environment string); everything else through ENVIRON (no escape processing).
HC_AWK='
function esc(s,  i, c, o) {
  o = ""
  for (i = 1; i <= length(s); i++) {
    c = substr(s, i, 1)
    if (c == "\\") o = o "\\\\"; else if (c == "\"") o = o "\\\""
    else if (c == "\n") o = o "\\n"; else if (c == "\t") o = o "\\t"
    else if (c == "\r") o = o "\\r"; else if (c in CTL) o = o sprintf("\\u%04x", CTL[c])
    else o = o c
  }
  return o
}
function unesc(s,  i, c, o, h, x) {
  o = ""
  for (i = 1; i <= length(s); i++) {
    c = substr(s, i, 1)
    if (c == "\\") {
      c = substr(s, ++i, 1)
      if (c == "n") c = "\n"; else if (c == "t") c = "\t"; else if (c == "r") c = "\r"
      else if (c == "b") c = "\b"; else if (c == "f") c = "\f"
      else if (c == "u") {
        h = tolower(substr(s, i + 1, 4)); c = "\\u" h; i += 4
        x = index(HEX, substr(h, 3, 1)) * 16 + index(HEX, substr(h, 4, 1)) - 17
        if (h ~ /^00[0-7][0-9a-f]$/ && x > 0) c = sprintf("%c", x)
      }
    }
    o = o c
  }
  return o
}
function trim(s) { gsub(/^[ \t\r]+|[ \t\r]+$/, "", s); return s }
function num(v) { v = trim(v); return (v ~ /^[0-9]+$/) ? v + 0 : "null" }
function flag(v) {
  v = tolower(trim(v))
  if (v == "yes" || v == "true") return "true"
  if (v == "no" || v == "false") return "false"
  if (v ~ /^[0-9]+$/) return (v + 0 > 0) ? "true" : "false"
  return "null"
}
function val(k, v) {
  if (k == "status" && td && tolower(v) ~ /^fail/) tf = 1
  else if (k == "name" && d == td) tn = v
  else if (k == "error_id") EI[d] = v
  else if (k == "error_severity") { ES[d] = v; if (v + 0 == 2) iso = 1 }
  else if (k == "error_category") EC[d] = v
  else if (k == "warning" || k == "error") EM[d] = v
  else if (k == "runtime_error" && v != "") RT[ph + 0] = v
}
# One DCGM error object: config (5) and reset (6) severities explain their test.
function err(x,  key, v) {
  v = (ES[x] == "") ? 0 : ES[x] + 0
  if (v == 5) { CT[tn] = 1; if (!(EI[x] in CS)) { CS[EI[x]] = 1; cids = cids (cids == "" ? "" : ", ") EI[x] } }
  else ncfg = 1
  if (v == 6 && !(EI[x] in RZ)) { RZ[EI[x]] = 1; rids = rids (rids == "" ? "" : ", ") EI[x] }
  if (v == 5 || v == 6) XT[tn] = 1; else nxr = 1
  key = tn SUBSEP EI[x]
  if (key in ESEEN) return
  ESEEN[key] = 1
  ER[++ne] = "{\"test\":\"" esc(tn) "\",\"error_id\":" num(EI[x]) ",\"severity\":" num(ES[x]) \
    ",\"category\":" num(EC[x]) ",\"message\":\"" esc(EM[x]) "\"}"
}
function E(k) { return ENVIRON["HC_" k] }
function gw(u) { return "GPU " ((u in UI) ? UI[u] " (" u ")" : u) }
function reason(lv, s) { if (lv > V) V = lv; R[++nr] = s }
function nv(s) { IV[++ni] = s }
# No test ran (exit != 0 or a runtime error), bar DCGM statuses naming a GPU state
# (-18 GPU lost, -19 reset required, -57 NVML driver timeout, -67 detached): no evidence.
function cr(rc, p) {
  if (!(rc || RT[p] != "") || rc ~ /^(23[78]|199|189)$/) return 0
  rs = (RT[p] == "") ? "" : ": " RT[p]; RT[p] = ""; return 1
}
function rr(s) { nrs++; R[++nr] = s }
# nvidia-smi -q "GPU Recovery Action" (man page values); anything else is unknown.
function rname(v) {
  v = tolower(v)
  return v == "none" ? v : v == "reset" ? "gpu_reset" : v == "reboot" ? "node_reboot" : \
    v == "drain p2p" ? "drain_p2p" : v == "drain and reset" ? "drain_and_reset" : "unknown"
}
function list(A, n,  i, o) { o = ""; for (i = 1; i <= n; i++) o = o (i > 1 ? "," : "") "\"" esc(A[i]) "\""; return "[" o "]" }
# The last 5 lines of nvidia-smi output that are not GPU rows (its error messages).
function sl(s,  y) { if (ns == 5) { for (y = 1; y < 5; y++) SE[y] = SE[y + 1]; ns = 4 } SE[++ns] = s }
function raw(A, n,  i, o) { o = ""; for (i = 1; i <= n; i++) o = o (i > 1 ? "," : "") A[i]; return "[" o "]" }
BEGIN { HEX = "0123456789abcdef"; for (i = 1; i < 32; i++) CTL[sprintf("%c", i)] = i }
{ J = J $0 "\n" }
END {
  n = length(J); i = index(J, "{"); if (!i) i = n + 1
  json = (i <= n); d = 0; td = 0; WK = 0
  while (i <= n) {
    c = substr(J, i, 1)
    if (c == "{" || c == "[") {
      d++; T[d] = c; K[d] = ""; WK = (c == "{"); KO[d] = (d > 1 && T[d-1] == "{") ? K[d-1] : ""
      EI[d] = ES[d] = EC[d] = EM[d] = ""
      if (c == "{" && !td && d > 2 && T[d-1] == "[" && KO[d-1] == "tests") { td = d; tn = ""; tf = 0; nt++ }
      i++; continue
    }
    if (c == "}" || c == "]") {
      if (EI[d] != "") err(d)
      if (d == td) {
        td = 0
        if (tf && !(tn in CT)) ncfg = 1
        if (tf && !(tn in XT)) nxr = 1
        if (tf) { if (tn == "") tn = "unknown"; if (!(tn in SEEN)) { SEEN[tn] = 1; FL[++nf] = tn } }
      }
      d--; i++
      if (d <= 0) {  # the diag JSON ends, the load JSON follows the marker line
        j = index(substr(J, i), "\n@@load@@\n"); if (!j || ph) break
        ph = 1; nf1 = nf; nt1 = nt; i += j + 9; j = index(substr(J, i), "{"); ljson = (j > 0); if (!j) break
        i += j - 1; d = 0
      }
      continue
    }
    if (c == ",") { WK = (T[d] == "{"); i++; continue }
    if (c == ":") { WK = 0; i++; continue }
    if (c == "\"") {
      j = i + 1
      while (j <= n) { e = substr(J, j, 1); if (e == "\\") j += 2; else if (e == "\"") break; else j++ }
      s = unesc(substr(J, i + 1, j - i - 1)); i = j + 1
      if (WK) { K[d] = s; WK = 0 } else if (T[d] == "{") val(K[d], s)
      continue
    }
    if (index(" \t\r\n", c)) { i++; continue }
    j = i; while (j <= n && !index(",}] \t\r\n", substr(J, j, 1))) j++
    if (T[d] == "{") val(K[d], substr(J, i, j - i))
    i = (j > i) ? j : i + 1
  }

  if (!ph) { nf1 = nf; nt1 = nt }
  V = 0; nr = 0; nn = 0; drc = E("DIAG_RC") + 0; cfg = (ne > 0 && !ncfg); OP = 0
  LD = E("LOAD") + 0; lrc = E("LOAD_RC") + 0; lw = "GPU load (" E("LOAD_TEST") ", " LD " s)"
  rst = (rids != "" && !nxr); DR = ""
  if (E("LEVEL_BAD") == 1) N[++nn] = "invalid DCGM_LEVEL \"" E("LEVEL_RAW") "\"; used level 2"
  if (E("LOAD_BAD") == 1) N[++nn] = "invalid VALIDATION_LOAD_SECONDS; no GPU load"
  if (E("DIAG_FOUND") != 1) nv("dcgmi cannot run (not found: " ENVIRON["DCGMI"] ")")
  else {
    if (drc == 205) reason(2, "dcgmi diag reported an isolate error (exit 205): isolate/replace the GPU")
    else if (drc == 124) reason(1, "dcgmi diag timed out")
    else if (!nt1 && cr(drc, 0)) nv("dcgmi diag ran no test (exit " drc ")" rs)
    else if (drc != 0 && cfg || nf1 && cfg) OP = 1
    else if (drc != 0 && rst || nf1 && rst) { DR = "dcgmi diag failed (exit " drc ") only on reset-severity errors (DCGM error " rids ")"; OP = (cids != "") }
    else if (drc != 0) reason(1, "dcgmi diag failed (exit " drc ")")
    else if (nf1) reason(1, "dcgmi diag exited 0 but reported failed tests")
    if (LD) {
      if (lrc == 205) reason(2, lw " reported an isolate error (exit 205)")
      else if (lrc == 124) reason(1, lw " did not finish in time (exit 124)")
      else if (nt == nt1 && cr(lrc, 1)) nv(lw " ran no test (exit " lrc ")" rs)
      else if ((lrc || nf > nf1) && cfg) OP = 1
      else if ((lrc || nf > nf1) && rst) { if (DR == "") DR = lw " failed (exit " lrc ") only on reset-severity errors (DCGM error " rids ")" }
      else if (lrc) reason(1, lw " failed (exit " lrc ")")
      else if (nf > nf1) reason(1, lw " exited 0 but reported failed tests")
      if (!ljson) N[++nn] = "the GPU load printed no JSON"
    }
    if (iso) reason(2, "dcgmi diag reported an isolate-severity error")
    for (x = 0; x < 2; x++) if (RT[x] != "") reason(1, "dcgmi runtime error: " RT[x])
    if (!json) N[++nn] = "dcgmi printed no JSON"
  }

  ng = 0; ns = 0
  if (E("SMI_FOUND") != 1) nv("nvidia-smi cannot run (not found: " ENVIRON["NVIDIA_SMI"] ")")
  else {
    if (E("GPU_RC") != 0) reason(1, "nvidia-smi --query-gpu failed (exit " E("GPU_RC") ")")
    m = split(E("GPU_OUT"), L, "\n")
    for (x = 1; x <= m; x++) {
      if (split(L[x], F, ",") < 3 || num(F[1]) == "null") { if (trim(L[x]) != "") sl(trim(L[x])); continue }
      ng++; GI[ng] = num(F[1]); GU[ng] = trim(F[2]); GE[ng] = num(F[3]); UI[GU[ng]] = GI[ng]
    }
    if (!ng && E("GPU_RC") == 0) reason(1, "nvidia-smi lists no GPU")
  }
  if (E("SMI_FOUND") == 1 && E("REMAP_RC") != 0)
    N[++nn] = "nvidia-smi --query-remapped-rows failed (exit " E("REMAP_RC") "); no row-remap data"
  else if (E("SMI_FOUND") == 1) {
    m = split(E("REMAP_OUT"), L, "\n")
    for (x = 1; x <= m; x++) {
      if (split(L[x], F, ",") < 3) continue
      u = trim(F[1]); RP[u] = flag(F[2]); RF[u] = flag(F[3])
      if (RF[u] == "true") reason(2, "row remapping failure on " gw(u))
      if (RP[u] == "true") { PR[u] = 1; rr("row remapping pending on " gw(u) ": a GPU reset applies it") }
    }
  }
  if (E("SMI_FOUND") == 1 && E("Q_RC") != 0)
    N[++nn] = "nvidia-smi -q failed (exit " E("Q_RC") "); recovery action and page retirement unknown"
  m = split(E("Q_OUT"), L, "\n"); u = ""; sc = ""; nq = 0
  for (x = 1; x <= m; x++) {
    s = L[x]; c = index(s, ":")
    if (s ~ /^GPU /) { u = ""; sc = ""; continue }
    if (s ~ /^    [^ ]/) sc = c ? "" : trim(s)
    if (!c) continue
    k = trim(substr(s, 1, c - 1)); v = trim(substr(s, c + 1))
    if (k == "GPU UUID") { u = v; QU[++nq] = v }
    else if (u != "" && k == "GPU Recovery Action") RA[u] = v
    else if (u != "" && sc == "Retired Pages" && k ~ /^Pending/) RT[u] = flag(v)
  }
  for (x = 1; x <= nq; x++) {
    u = QU[x]; a = rname(RA[u]); RN[u] = a; w = gw(u)
    if (a ~ /reset$/) { PR[u] = 1; rr("driver recovery action on " w ": " RA[u]) }
    else if (a ~ /^(node_reboot|drain_p2p)$/) reason(1, "driver recovery action on " w ": " RA[u] ": a GPU reset is not enough")
    else if (a == "unknown" && RA[u] !~ /^(|N\/A|\[N\/A\])$/) N[++nn] = "recovery action on " w " not recognized: " RA[u]
    if (RT[u] == "true") reason(1, "pages pending retirement on " w ": retired at the next reboot")
  }
  for (u in PR) np++
  if (DR != "") { if (np) rr(DR); else reason(1, DR) }
  g = ""
  for (x = 1; x <= ng; x++) {
    u = GU[x]
    s = "uncorrected volatile ECC errors on GPU " GI[x] ": " GE[x]
    if (GE[x] != "null" && GE[x] > 0) { if (u in PR) rr(s " (cleared by that reset)"); else reason(1, s) }
    g = g (x > 1 ? "," : "") "{\"index\":" GI[x] ",\"uuid\":\"" esc(u) "\",\"ecc_uncorrected_volatile\":" GE[x] \
      ",\"remap_pending\":" ((u in RP) ? RP[u] : "null") ",\"remap_failure\":" ((u in RF) ? RF[u] : "null") \
      ",\"recovery_action\":\"" ((u in RN) ? RN[u] : "unknown") "\",\"retired_pages_pending\":" ((u in RT) ? RT[u] : "null") "}"
  }
  if (!V && nrs) V = 4
  if (OP) {
    s = "dcgmi diag failed only on configuration errors (DCGM error " cids "): an operator must fix the configuration, a reboot does not"
    if (V) N[++nn] = s; else { V = 3; R[++nr] = s }
  }
  for (x = 1; x <= ni; x++) if (V) N[++nn] = IV[x]; else R[++nr] = IV[x]
  if (!V && ni) V = 5
  split("healthy reboot replace operator_action reset inconclusive", VN, " ")
  printf "{\"verdict\":\"%s\",\"exit_code\":%d,\"dcgm_level\":%d,\"dcgmi_exit_code\":%s,", VN[V + 1], V, E("LEVEL"), (E("DIAG_FOUND") == 1) ? drc : "null"
  printf "\"failed_tests\":%s,\"errors\":%s,\"gpus\":[%s],\"smi_exit_code\":%s,\"smi_errors\":%s,", list(FL, nf), raw(ER, ne), g, (E("SMI_FOUND") == 1) ? E("GPU_RC") + 0 : "null", list(SE, ns)
  printf "\"load\":%s,", (LD && E("DIAG_FOUND") == 1) ? "{\"test\":\"" E("LOAD_TEST") "\",\"seconds\":" LD ",\"dcgmi_exit_code\":" lrc "}" : "null"
  printf "\"reasons\":%s,\"notes\":%s,\"hostname\":\"%s\"}\n", list(R, nr), list(N, nn), esc(E("HOST"))
  exit V
}'

# A dead awk can exit 2 or 137 too: only a whole verdict line is a verdict.
HC_OUT=$(printf '%s\n@@load@@\n%s\n' "$HC_DIAG_OUT" "$HC_LOAD_OUT" | awk "$HC_AWK")
HC_RC=$?
case "$HC_RC $HC_OUT" in
  [0-5]' {"verdict":"'*'","exit_code":'"$HC_RC"',"'*'"}') printf '%s\n' "$HC_OUT" ;;
  *)
    hc_log "results not evaluated (awk exit $HC_RC): no verdict"
    printf '{"verdict":"inconclusive","exit_code":5,"dcgm_level":%s,"dcgmi_exit_code":%s,"failed_tests":[],"errors":[],"gpus":[],"smi_exit_code":null,"smi_errors":[],"load":null,"reasons":["health check could not evaluate results"],"notes":[],"hostname":"%s"}\n' \
      "$HC_LEVEL" "$HC_DIAG_RC" "$(printf '%s' "$HC_HOST" | tr -cd 'A-Za-z0-9._-')"
    HC_RC=5 ;;
esac
exit "$HC_RC"
