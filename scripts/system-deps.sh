#!/usr/bin/env bash
# System packages the dev cluster needs: the real Prometheus and Alertmanager servers from Debian, and
# promtool (in the prometheus package), which evaluates the chart's alerts (tests/unit/test_chart_rules.py).
# Idempotent and quiet when everything is present; `apt-get update` runs only when a package is missing.
set -euo pipefail

declare -A wanted=(
  [/usr/bin/prometheus]=prometheus
  [/usr/bin/promtool]=prometheus
  [/usr/bin/prometheus-alertmanager]=prometheus-alertmanager
)

missing=()
for bin in "${!wanted[@]}"; do
  [[ -x "$bin" ]] || missing+=("${wanted[$bin]}")
done
[[ ${#missing[@]} -eq 0 ]] && exit 0

if [[ $(id -u) -ne 0 ]]; then
  sudo="sudo"
else
  sudo=""
fi
echo "system-deps: installing ${missing[*]} (apt-get)"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
# --no-install-recommends keeps node-exporter and friends out; the packages' own services are never
# started by us (no systemd here), the dev cluster runs the binaries itself on loopback ports.
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
for bin in "${!wanted[@]}"; do
  [[ -x "$bin" ]] || { echo "system-deps: $bin still missing after installing ${wanted[$bin]}" >&2; exit 1; }
done
echo "system-deps: ok"
