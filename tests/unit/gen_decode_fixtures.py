#!/usr/bin/python3
"""Generates the byte-exact msgpack fixtures of tests/unit/test_decode.c and the seed corpus
of tests/fuzz/fuzz_decode.c.

Encoding follows msgspec's rules (spec §2.1): Python msgpack with use_bin_type=True picks the
same smallest int widths, float64 for floats, fixstr/str8, bin8 for bytes and
fixarray/array16/array32, which is how the spec's §7 example was produced too.

  /usr/bin/python3 tests/unit/gen_decode_fixtures.py --update tests/unit/test_decode.c
  /usr/bin/python3 tests/unit/gen_decode_fixtures.py --corpus tests/fuzz/corpus/decode

--update rewrites the block between the GENERATED FIXTURES markers; --corpus writes one file
per fixture in fuzz_decode's input format: [topic_len u8][seq_len u8][topic][seq][payload].
"""
import msgpack
import os
import struct
import sys

TS = 1789095808.8378847
H = 0xDAB89BAA7B5857C0
TOK16 = [151644, 872, 198, 9064, 374, 279, 6722, 315, 5616, 30, 151645, 198, 151644,
         77091, 198, 151667]
SHA = bytes.fromhex("202da172482d928bbc42ab25b0151e2b895f13f41002e27b2ceabcfae6d332ea")


def pk(o):
    return msgpack.packb(o, use_bin_type=True)


def stored_map(**kw):
    d = {"type": "BlockStored"}
    d.update(kw)
    return d


F = {}

# §7 map form (v0.24+), 239 bytes; key order as msgspec writes it.
F["spec_map"] = pk([TS, [{
    "type": "BlockStored", "block_hashes": [H], "parent_block_hash": None,
    "token_ids": TOK16, "block_size": 16, "lora_id": None, "medium": "GPU",
    "lora_name": None, "extra_keys": [None], "group_idx": 0,
    "kv_cache_spec_kind": "full_attention"}], 0])
# §7 positional form (v0.22/v0.23), 118 bytes.
F["spec_array"] = pk([TS, [["BlockStored", [H], None, TOK16, 16, None, "GPU", None, [None],
                            0, "full_attention", None]], 0])
# v0.9.0: two-element batch, 6-field BlockStored, 2-field BlockRemoved, Python hash() ints
# (negative), int ts.
F["v090"] = pk([1700000000, [
    ["BlockStored", [-5, -6148914691236517206], None, [1, 2, 3, 4, 5, 6, 7, 8], 4, None],
    ["BlockStored", [1234567], -6148914691236517206, [9, 10, 11, 12], 4, 7],
    ["BlockRemoved", [-5]]]])
# v0.10.2 7-field events: int hashes and bin hashes (sha256 bytes mode; offload connector
# mixing bin with int in one batch), bin parent.
F["v0102_bin"] = pk([TS, [
    ["BlockStored", [SHA, 3236607068019569386], SHA, list(range(1, 33)), 16, None, "GPU"],
    ["BlockRemoved", [SHA], "CPU"]], 1])
# Negative hashes in every signed width, and a uint64 parent.
F["neg_hashes"] = pk([TS, [["BlockStored",
                            [-1, -100, -1000, -100000, -(2**63), -(2**31) - 1],
                            2**64 - 1, [], 0, None, "GPU"]], 0])
# bin hashes: 3 bytes (left pad), exactly 8, 16 (xxhash digest), 64 (2×sha256 concat).
F["short_bin"] = pk([TS, [["BlockRemoved",
                           [b"\x01\x02\x03", bytes(range(1, 9)), bytes(range(16)),
                            bytes(range(64))], "GPU", 0]], 0])
F["empty_bin"] = pk([TS, [["BlockRemoved", [b""], "GPU"],
                          ["BlockStored", [1], b"", [], 0, None, "GPU"],
                          ["BlockRemoved", [2], "GPU"]], 0])
# v0.22: 12-element arrays; a LoRA (lora_name + legacy lora_id), a sliding-window group.
F["v022"] = pk([TS, [
    ["BlockStored", [11, 12], 10, list(range(100, 132)), 16, 3, "GPU", "my-lora",
     [["my-lora", ["mmhash", -3]], ["my-lora"]], 0, "full_attention", None],
    ["BlockStored", [11], None, list(range(100, 116)), 16, None, "GPU", None, None, 1,
     "sliding_window", 4096],
    ["BlockStored", [21], 20, list(range(16)), 16, 5, "GPU", None, None, 2, "mla_attention",
     None]], 3])
# v0.24+ maps: omitted defaults, shuffled keys, unknown keys; several other shapes.
F["v024_maps"] = pk([TS, [
    {"token_ids": list(range(16)), "locality": "LOCAL", "block_size": 16, "medium": "CPU",
     "parent_block_hash": 77, "session_id": "s1", "type": "BlockStored",
     "block_hashes": [78], "lora_name": "ad", "lora_id": 9, "ownership": "x",
     "extra_keys": [["salt", ["img", 0]]], 42: "int key", "cache_salt": "zz"},
    {"block_hashes": [79], "type": "BlockStored", "token_ids": list(range(16, 32)),
     "block_size": 16, "parent_block_hash": 78, "lora_id": None, "medium": "GPU",
     "lora_name": None, "kv_cache_spec_sliding_window": None,
     "kv_cache_spec_kind": "SINK_FULL_ATTENTION", "group_idx": 3},
    {"type": "BlockStored", "block_hashes": [80], "token_ids": None},
    ], 2])
# BlockRemoved / AllBlocksCleared in both forms (§7).
F["removed_cleared"] = pk([TS, [
    {"type": "BlockRemoved", "block_hashes": [H], "medium": "GPU", "group_idx": 0},
    ["BlockRemoved", [H], "GPU", 0],
    {"type": "AllBlocksCleared"},
    ["AllBlocksCleared"],
    {"medium": "GPU", "block_hashes": [1, 2, 3], "type": "BlockRemoved", "locality": "LOCAL"},
    {"type": "AllBlocksCleared", "extra": [1, 2]},
    ["AllBlocksCleared", "whatever", 1],
    {"type": "BlockRemoved", "block_hashes": [4], "group_idx": 1},
    ["BlockRemoved", [5], None, 2],
    ], 0])
# A batch mixing valid events with unknown tags and malformed ones.
F["mixed"] = pk([TS, [
    ["BlockStored", [1], None, [1, 2], 2, None, "GPU"],                  # 0 ok
    ["BlockInactive", [1]],                                              # 1 unknown_tag
    {"type": "BlockStored", "block_hashes": [2], "token_ids": ["x", 1],  # 2 bad_tokens
     "block_size": 2},
    42,                                                                  # 3 not_event
    [1, 2, 3],                                                           # 4 no_tag
    {"block_hashes": [3]},                                               # 5 no_tag
    {"type": 7},                                                         # 6 no_tag
    ["BlockStored", [1.5], None, [1, 2], 2],                             # 7 bad_hash
    ["BlockStored", "nope", None, [1, 2], 2],                             # 8 bad_field
    ["BlockStored", [4], None, [1, 2, 3], 2],                            # 9 token_count
    ["BlockStored", [5], None, [1, 2], 2, None, "GPU", None, None, 1],   # 10 group (no kind)
    ["BlockStored", [6], None, [1, 2], 2, None, 5],                      # 11 bad_field medium
    ["BlockStored", [7], None, [-1, 2], 2],                              # 12 bad_tokens
    ["BlockStored", [8], None, [1, 2**32], 2],                           # 13 bad_tokens
    ["BlockStored", [9], None, [[1, 2], [3, 4]], 2],                     # 14 eagle_bigram
    ["BlockStored", [10], None, [1, 2], -2],                             # 15 bad_field
    ["BlockStored", [11], None, [1, 2], 2, None, "GPU", None, None, 0,
     "mamba"],                                                           # 16 group
    ["BlockStored", [12], None, "tok", 2],                               # 17 bad_tokens
    ["BlockStored", [13], "p", [1, 2], 2],                               # 18 bad_hash
    [],                                                                  # 19 no_tag
    None,                                                                # 20 not_event
    ["BlockRemoved", [14], "GPU"],                                       # 21 ok
    ["BlockStored", [15], None, [2**32 - 1, 0], 2, 2**63, "GPU"],        # 22 bad_field
    ["BlockStored", [16, 17], 15, [5, 6, 7, 8], 2, -1, "GPU", None],     # 23 ok
    ["BlockStored"],                                                     # 24 bad_field
    ["BlockRemoved", [18], "GPU", -1],                                   # 25 bad_field
    ], 5])
# SGLang (python/sglang/srt/disaggregation/kv_events.py): msgspec array_like structs without
# omit_defaults, so every field is written. EventBatch [ts, events, attn_dp_rank];
# BlockStored [tag, block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium];
# BlockStoredWithMetadata adds metadata: BlockStoredMetadata {cache_salt} (a map) at [7];
# BlockRemoved [tag, block_hashes, medium]; AllBlocksCleared [tag]. Hashes are signed i64
# (hash_str_to_int64). StorageMedium: GPU, CPU_PINNED, DISK, EXTERNAL (older: CPU_TIER1/2).
# EAGLE pages carry (t, t+1) tuples. Recent versions write the vLLM layout plus locality and
# ownership ([12], [13]; BlockRemoved [6], [7]; AllBlocksCleared [1]), the salt as an extra
# key "dynamo-cache-salt:<salt>" and the metadata map at [14]; tagged maps carry cache_salt
# and session_id.
SG_TOK = list(range(500, 516))
F["sglang"] = pk([TS, [
    ["BlockStored", [-7, 2**62], None, SG_TOK + SG_TOK, 16, None, "GPU"],          # 0
    ["BlockStored", [-9], -7, SG_TOK, 16, None, "CPU_PINNED",
     {"cache_salt": "tenant-a"}],                                                   # 1
    ["BlockStored", [-11], None, SG_TOK, 16, None, "DISK", None,
     [["dynamo-cache-salt:tenant-a"]], None, None, None, "REMOTE", None,
     {"cache_salt": "tenant-a"}],                                                   # 2
    ["BlockRemoved", [-7], "CPU_TIER1"],                                            # 3
    ["BlockRemoved", [-9], "EXTERNAL", None, None, None, "REMOTE", None],           # 4
    ["AllBlocksCleared", None],                                                     # 5
    {"type": "BlockStored", "block_hashes": [-13], "parent_block_hash": None,
     "token_ids": SG_TOK, "block_size": 16, "lora_id": None, "medium": "CPU_TIER2",
     "cache_salt": "tenant-b", "session_id": "sess-1"},                            # 6
    ["BlockStored", [-15], None, [[t, t + 1] for t in range(4)], 4, None, "GPU"],  # 7 EAGLE
    ["BlockStored", [-17, -19], None, SG_TOK + SG_TOK, 16, None, "GPU", None,
     [["dynamo-cache-salt:tenant-a"]], None, None, None, None, None,
     {"cache_salt": "tenant-a"}],                                                   # 8 coalesced
    ], None])
# vLLM extra keys (v0.17+) and the newest fields: LoRA name first on every block, media as
# [identifier, offset in block], cache_salt on block 0, prompt-embeds digests as bin;
# locality/ownership/session_id on BlockStored; BlockRemoved with remaining_copy_counts.
F["extra_keys"] = pk([TS, [
    {"type": "BlockStored", "block_hashes": [31, 32], "parent_block_hash": None,
     "token_ids": list(range(32)), "block_size": 16, "lora_id": 4, "medium": "GPU",
     "lora_name": "ad", "extra_keys": [["ad", ["img0", 3], "s1"], ["ad", ["img0", -13]]],
     "group_idx": 0, "kv_cache_spec_kind": "full_attention", "locality": "REMOTE",
     "ownership": "tier-7", "session_id": "sess-9"},                                # 0
    ["BlockStored", [33, 34], None, list(range(32)), 16, None, "GPU", None,
     [["s1"], None], 0, "full_attention", None],                                    # 1
    {"type": "BlockStored", "block_hashes": [35], "token_ids": list(range(16)),
     "block_size": 16, "extra_keys": [[bytes(range(32)), 7, 1.5]]},                # 2
    {"type": "BlockStored", "block_hashes": [36, 37], "token_ids": list(range(32)),
     "block_size": 16, "extra_keys": [["x"]]},                                      # 3 bad_field
    {"type": "BlockRemoved", "block_hashes": [31, 32], "medium": "GPU",
     "remaining_copy_counts": [0, 2], "locality": "remote", "ownership": "tier-7"}, # 4
    {"type": "BlockRemoved", "block_hashes": [31], "remaining_copy_counts": [1, 2]},  # 5 bad
    {"type": "BlockStored", "block_hashes": [38], "token_ids": list(range(16)),
     "block_size": 16, "extra_keys": 5},                                            # 6 bad_field
    {"type": "BlockStored", "block_hashes": [39], "token_ids": list(range(16)),
     "block_size": 16, "extra_keys": [None], "future_field": [1, {"a": 2}]},       # 7 plain
    ], 0])
# Token-count mismatch with nil tokens, and block_size omitted (no check).
F["token_count"] = pk([TS, [
    ["BlockStored", [1, 2], None, list(range(31)), 16, None, "GPU"],
    {"type": "BlockStored", "block_hashes": [1], "token_ids": None, "block_size": 16},
    {"type": "BlockStored", "block_hashes": [1], "token_ids": [1, 2, 3]},
    ["BlockStored", [SHA], None, [], 0, None, "CPU"],
    ], 0])
# Outer shapes: float32 ts, nil dp_rank, extra trailing elements.
F["outer_f32"] = b"\x94\xca\x4f\x00\x00\x00\x90\xc0\xa3xyz"
F["outer_negts"] = pk([-3, [], 4294967295, "extra", {"k": 1}])
F["deep_extra"] = pk([TS, [["BlockStored", [1], None, [1], 1, None, "GPU", None,
                            [[[[[[[[[[[1]]]]]]]]]]]]], 0])


def c_array(name, b):
    lines = []
    for i in range(0, len(b), 16):
        lines.append("    " + ", ".join("0x%02x" % x for x in b[i:i + 16]) + ",")
    return ("/* %d bytes */\nstatic const uint8_t FX_%s[] = {\n%s\n};\n"
            % (len(b), name.upper(), "\n".join(lines)))


def update(path):
    src = open(path).read()
    a = "/* BEGIN GENERATED FIXTURES (tests/unit/gen_decode_fixtures.py --update) */\n"
    z = "/* END GENERATED FIXTURES */"
    i, j = src.index(a) + len(a), src.index(z)
    body = "\n".join(c_array(k, v) for k, v in F.items())
    open(path, "w").write(src[:i] + body + src[j:])


def corpus(d):
    os.makedirs(d, exist_ok=True)
    topic = b"kv@10.0.0.5@Qwen/Qwen3-8B"
    for n, (k, v) in enumerate(F.items()):
        seq = struct.pack(">Q", 42 + n)
        open(os.path.join(d, "fx_" + k), "wb").write(bytes([len(topic), 8]) + topic + seq + v)
    # frame-level shapes: default empty topic, 7-byte seq, replay end marker (ff x8 + empty)
    open(os.path.join(d, "empty_topic"), "wb").write(b"\x00\x08" + bytes(8) + F["spec_map"])
    open(os.path.join(d, "seq7"), "wb").write(b"\x05\x07kv@a@" + bytes(7) + F["v090"])
    open(os.path.join(d, "replay_end"), "wb").write(b"\x00\x08" + b"\xff" * 8)
    open(os.path.join(d, "huge_decl"), "wb").write(b"\x06\x08kv@a@b" + bytes(8) +
                                                    b"\x93\x00\x91\xdd\xff\xff\xff\xff\x00")
    open(os.path.join(d, "deep33"), "wb").write(b"\x00\x08" + bytes(8) + b"\x92\x00" +
                                                 b"\x91" * 32 + b"\x00")
    # one 4096-token event (its unpacked objects outgrow the decoder's initial 64 KiB zone)
    big = pk([TS, [stored_map(block_hashes=list(range(1000, 1256)), parent_block_hash=999,
                              token_ids=[(i * 7919) % 152000 for i in range(4096)],
                              block_size=16, medium="GPU")], 0])
    open(os.path.join(d, "big_event"), "wb").write(b"\x00\x08" + bytes(8) + big)
    open(os.path.join(d, "model_at"), "wb").write(b"\x0a\x08kv@p@m@x@y" + bytes(8) +
                                                   F["removed_cleared"])
    # bulk arrays with odd encodings inside long runs (the decoder's token windows stop at
    # them and resume): 160 token ids where #70 is uint64-encoded and #100 int8, hashes
    # mixing a bin, a negative int16 and ints, in a v0.22-style array event
    arr = bytearray(b"\xdc" + struct.pack(">H", 160))
    for i in range(160):
        if i == 70:
            arr += b"\xcf" + struct.pack(">Q", 123)
        elif i == 100:
            arr += b"\xd0\x05"
        elif i % 3:
            arr += b"\xcd" + struct.pack(">H", (i * 977) % 65536)
        else:
            arr += b"\xce" + struct.pack(">I", 70000 + i)
    hashes = (b"\x9a" + b"\xc4\x03abc" + b"\xd1\xfe\xd4" +
              b"".join(b"\xcf" + struct.pack(">Q", 2**63 + i) for i in range(8)))
    ev = (b"\x9c\xabBlockStored" + hashes + b"\xc0" + bytes(arr) + b"\x10\xc0\xa3GPU\xc0" +
          b"\x9a" + b"\xc0" * 10 + b"\x00\xaefull_attention\xc0")
    batch = b"\x93\xcb" + struct.pack(">d", TS) + b"\x91" + ev + b"\x00"
    open(os.path.join(d, "bulk_odd"), "wb").write(b"\x00\x08" + bytes(8) + batch)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--update":
        update(sys.argv[2])
    elif len(sys.argv) == 3 and sys.argv[1] == "--corpus":
        corpus(sys.argv[2])
    else:
        for k, v in F.items():
            print(k, len(v), v.hex())
