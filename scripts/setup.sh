#!/usr/bin/env bash
# Installs everything krab needs to build, test and benchmark, from Debian 12 packages only.
# Idempotent: packages already present are not fetched again. Needs root (or sudo).
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  clang-14 libfuzzer-14-dev           # the ASan + UBSan build is clang's, and fuzzes (docs/fuzzing.md)
  ccache
  clang-format-14                     # scripts/format.sh (CI checks the formatting)
  libtorch-dev libgloo-dev            # LibTorch 1.13 (CPU) with c10d + Gloo
  libopenblas0-pthread                # switches libblas.so.3 to OpenBLAS: ~30x faster matmul
  libopenmpi-dev openmpi-bin          # MPI backend
  libyaml-cpp-dev nlohmann-json3-dev libcli11-dev zlib1g-dev
  libpng-dev libjpeg62-turbo-dev       # data.name images: PNG and JPEG decoding
  libgrpc++-dev protobuf-compiler-grpc protobuf-compiler libprotobuf-dev  # parameter server + federated RPC
  sentencepiece                       # SentencePiece tokenizers for text (spm_encode; spm_train makes models)
  libsodium-dev openssl               # secure aggregation (X25519, ChaCha20); TLS certificates in tests
  strace                              # tests: the federated server never opens a client's data
  libgtest-dev libgmock-dev
  dataset-fashion-mnist               # the demo's data
  python3-torch                       # the peer for benchmarks and the torch.load check
  python3-torchvision                 # bench/real_networks.py: ResNet and MobileNet, random init
  iproute2                            # network-namespace tests
  etcd-server etcd-client             # elastic: the etcd rendezvous and its tests (a private etcd)
  libcpp-httplib-dev                  # elastic: the etcd client (compiled, not header-only)
  slurm-wlm munge                     # elastic: the Slurm autoscale provider and its test
  prometheus                          # monitor.port's test scrapes a run with a private one
)

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }

missing=()
for p in "${packages[@]}"; do
  installed "$p" || missing+=("$p")
done

# Packages whose install starts and enables a system service (package:service). krab's tests
# start private instances on free ports in temp dirs and never use the system's, so a service
# that this run installs is stopped and disabled again; one that was there before is left alone.
daemons=(etcd-server:etcd munge:munge slurmctld:slurmctld slurmd:slurmd prometheus:prometheus)
new_services=()
for d in "${daemons[@]}"; do
  installed "${d%%:*}" || new_services+=("${d#*:}")
done
if ((${#missing[@]} == 0)); then
  echo "setup: all ${#packages[@]} packages present"
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"

for service in "${new_services[@]}"; do
  if [[ -d /run/systemd/system ]]; then
    $SUDO systemctl disable --now "$service" >/dev/null 2>&1 || true
  else  # no systemd (a container): its unit and sysv links, and a daemon an init script started
    $SUDO systemctl disable "$service" >/dev/null 2>&1 || true
    $SUDO update-rc.d "$service" disable >/dev/null 2>&1 || true
    $SUDO service "$service" stop >/dev/null 2>&1 || true
  fi
done
