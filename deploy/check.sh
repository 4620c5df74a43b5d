#!/usr/bin/env bash
# Checks the deployment files without a container engine (make deploy-check; .ci/run):
#   hadolint on the Dockerfile, kubernetes-validate --strict on the Kubernetes manifests, yamllint on
#   every YAML file of the project, `systemd-analyze verify` on the unit, and `docker-compose config
#   -q` (Debian's docker-compose, which checks against the Compose schema) on the Compose files, and
#   promtool on the Prometheus configuration and alerting rules.
# The tools come from deploy/install-deps.sh. Usage: deploy/check.sh [TRAINERD_BINARY]
set -euo pipefail
cd "$(dirname "$0")/.."
. build/deps.env
tools="${TRAINERD_DEPLOY_TOOLS:?run deploy/install-deps.sh first}"
daemon="${1:-build/release/server/trainerd}"
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
failed=0
step() {
  local name="$1"; shift
  if "$@"; then echo "deploy-check: $name: ok"; else echo "deploy-check: $name: FAILED"; failed=1; fi
}

step hadolint "$tools/hadolint" Dockerfile

# kustomization.yaml is kustomize's, not a resource; the ServiceMonitor's schema is the Prometheus
# Operator's CRD, which kubernetes-validate does not hold (yamllint still checks it).
step kubernetes-validate "$tools/kubernetes-validate" --strict --quiet \
  deploy/k8s/namespace.yaml deploy/k8s/daemonset.yaml deploy/k8s/service.yaml \
  deploy/k8s/networkpolicy.yaml

mapfile -t yaml_files < <(git ls-files '*.yaml' '*.yml')
step yamllint yamllint --strict -c .yamllint.yaml "${yaml_files[@]}"

# verify wants ExecStart's program to exist: the unit is checked with the built daemon in its place.
if [ -x "$daemon" ]; then
  sed "s|/usr/local/bin/trainerd|$(realpath "$daemon")|" deploy/systemd/trainerd.service \
    >"$scratch/trainerd.service"
  step systemd-analyze env SYSTEMD_LOG_COLOR=0 systemd-analyze verify "$scratch/trainerd.service"
else
  echo "deploy-check: systemd-analyze: FAILED: no daemon at $daemon to stand in for ExecStart"
  failed=1
fi

printf 'ci:%s\n' "$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')" >"$scratch/token"
compose() { TRAINERD_TOKEN_FILE="$scratch/token" docker-compose "$@" config -q; }
step "docker-compose (GPU)" compose -f deploy/compose.yaml
step "docker-compose (CPU override)" compose -f deploy/compose.yaml -f deploy/compose.cpu.yaml
# Prometheus' own checks of the scrape config and the alerting rules it loads (Debian's promtool).
step "promtool check config" promtool check config deploy/prometheus/prometheus.yml
step "promtool check rules" promtool check rules deploy/prometheus/alerts.yml

exit "$failed"
