#!/usr/bin/env bash
# lint-deploy.sh — offline checks of the deployment files (no Docker engine
# needed): the Grafana dashboard is JSON, the Prometheus config and alert
# rules load and their unit tests pass (promtool, Debian package prometheus),
# and docker-compose.yml parses (docker-compose, Debian package
# docker-compose), and the Kubernetes manifests of deploy/kubernetes render
# with kustomize, decode strictly into the API types, reference only what
# they define, run the migrate Job as a MySQL user other than the relay's,
# and take an edit of a config file or a password without changing the Job
# (deploy/kubernetes/check, its own Go module; no cluster; its modules come
# from the Go module proxy once, then from the module cache).
# Missing tools are installed with apt-get.
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v docker-compose >/dev/null 2>&1 || need+=(docker-compose)
if [ "${#need[@]}" -gt 0 ]; then
	echo "lint-deploy: installing ${need[*]} with apt-get"
	apt-get update -q >/dev/null
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
fi
python3 -m json.tool deploy/grafana-dashboard.json >/dev/null
promtool check config deploy/prometheus.yml
promtool test rules deploy/alerts_test.yml
docker-compose -f docker-compose.yml config -q
(cd deploy/kubernetes/check && ${GO:-go} vet ./... && ${GO:-go} test -count=1 ./...)
echo "lint-deploy: deploy files are valid"
