#!/usr/bin/python3
"""Engine-hash vectors for blocks with extra keys: LoRA, cache salt and
multimodal items (extra_keys_vectors.json beside this file).

Made with CPython's own pickler, hashlib, cbor2 and python3-xxhash (Debian's
python3-cbor2 and python3-xxhash), exactly as vLLM hashes a block:

    H((parent_digest, tuple(block_token_ids), extra_keys))

with extra_keys built by the rules of vLLM's kv_cache_utils.py (>= 0.19.1,
PR #36708), transcribed here:

  generate_block_hash_extra_keys: lora_name, then the multimodal keys, then
  cache_salt (first block only); None when empty.
  _gen_mm_extra_hash_keys: items sorted by offset; nothing when the last item
  ends at or before the block start; start_mm_idx -1 = the last item; an item
  the block has passed (block start >= item end) is skipped; an item the block
  overlaps adds (identifier, item offset - block start) and, when the block
  reaches the item's end, the scan moves on to the next item, else stops.
  request_block_hasher: a call hashes every new full block; it starts its mm
  scan at item 0 when it starts at token 0, else at the last item (-1), and
  threads the index from block to block. The prompt's blocks are hashed in
  one call at request creation; each block completed by generated tokens in
  a call of its own.

Run: python3 make_extra_keys_vectors.py > extra_keys_vectors.json
(the file is a golden vector: never regenerate it to make a test pass).
"""
import hashlib
import json
import pickle

import cbor2
import xxhash


def h_sha256(obj):
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def h_sha256_cbor(obj):
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def h_xxhash(obj):
    return xxhash.xxh3_128_digest(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def h_xxhash_cbor(obj):
    return xxhash.xxh3_128_digest(cbor2.dumps(obj, canonical=True))


ALGOS = {"sha256": h_sha256, "sha256_cbor": h_sha256_cbor,
         "xxhash": h_xxhash, "xxhash_cbor": h_xxhash_cbor}


def mm_keys(items, start, end, idx):
    keys = []
    if not items:
        return keys, idx
    last = items[-1]
    if last["offset"] + last["length"] <= start:
        return keys, idx
    if idx < 0:
        idx = len(items) + idx
    while idx < len(items):
        it = items[idx]
        if end > it["offset"]:
            if start >= it["offset"] + it["length"]:
                idx += 1
                continue
            keys.append((it["hash"], it["offset"] - start))
            if end >= it["offset"] + it["length"]:
                idx += 1
            else:
                break
        else:
            break
    return keys, idx


def extra_keys(case, start, end, idx):
    mm, idx = mm_keys(case["mm_items"], start, end, idx)
    lora = [case["lora_name"]] if case["lora_name"] else []
    salt = [case["cache_salt"]] if (start == 0 and case["cache_salt"]) else []
    keys = lora + mm + salt
    return (tuple(keys) if keys else None), idx, mm


def run(case, algo):
    fn = ALGOS[algo]
    seed = case["seed"]
    root = fn(seed)
    bs = case["block_size"]
    tok = case["token_ids"]
    blocks = []
    parent = root
    # the prompt's blocks in one call (scan from item 0), then each block
    # completed by generated tokens in its own call (scan from the last item)
    n_prompt_blocks = case["prompt_len"] // bs
    idx = 0
    for b in range(len(tok) // bs):
        start, end = b * bs, (b + 1) * bs
        if b >= n_prompt_blocks:
            idx = 0 if start == 0 else -1
        keys, idx, mm = extra_keys(case, start, end, idx)
        d = fn((parent, tuple(tok[start:end]), keys))
        blocks.append({
            "extra_keys": {
                "lora_name": case["lora_name"],
                "mm": [[m[0], m[1]] for m in mm],
                "cache_salt": case["cache_salt"] if (start == 0 and case["cache_salt"]) else None,
            } if keys else None,
            "digest": d.hex(),
            "low64": str(int.from_bytes(d[-8:], "big")),
        })
        parent = d
    return root, blocks


def case(name, bs, tokens, prompt_len, lora=None, salt=None, mm=()):
    return {"name": name, "seed": "0", "block_size": bs, "token_ids": tokens,
            "prompt_len": prompt_len, "lora_name": lora, "cache_salt": salt,
            "mm_items": [{"offset": o, "length": n, "hash": h} for (o, n, h) in mm]}


IMG = "f3a9" * 16  # a 64-hex-digit identifier, as vLLM's mm hashes are
CASES = [
    case("lora_only", 4, list(range(1, 13)), 12, lora="adapter-1"),
    case("salt_first_block_only", 4, list(range(1, 13)), 12, salt="tenant-7"),
    case("lora_then_salt", 4, list(range(1, 13)), 12, lora="adapter-1", salt="tenant-7"),
    # one item over blocks 0..2: offsets 2, -2, -6
    case("mm_one_item_three_blocks", 4, [9, 9] + [151655] * 9 + [5] * 5, 16,
         mm=[(2, 9, IMG)]),
    # two items, the first ends where block 1 starts, the second fills block 2
    case("mm_item_ends_on_a_block_boundary", 4, [151655] * 4 + [7] * 4 + [151655] * 4, 12,
         mm=[(0, 4, "img-a"), (8, 4, "img-b")]),
    # two items inside one block, after the LoRA name, before the salt
    case("lora_mm_two_items_salt", 8, [1, 151655, 151655, 2, 151655, 151655, 151655, 3,
                                       4, 5, 6, 7, 8, 9, 10, 11], 16,
         lora="adapter-2", salt="s", mm=[(1, 2, "img-a"), (4, 3, "img-b")]),
    # four keys (MARK ... TUPLE): lora, two items, salt, in block 0
    case("four_extra_keys_use_mark", 4, [151655, 151655, 151655, 151655, 1, 2, 3, 4], 8,
         lora="l", salt="t", mm=[(0, 2, "a"), (2, 2, "b")]),
    # generated tokens complete block 2: its scan starts at the last item,
    # which ends at the prompt's end, in that block
    case("decode_block_overlaps_the_last_item", 4, [1, 2, 3, 4, 5, 6, 7, 8, 151655, 151655,
                                                    11, 12], 10, mm=[(8, 2, "img-z")]),
    # generated tokens complete block 2, which starts where the last item
    # ended: no key (the <= early exit)
    case("decode_block_after_the_last_item", 4, [1, 2, 3, 4, 151655, 151655, 151655, 151655,
                                                 9, 10, 11, 12], 9, mm=[(4, 4, "img-y")]),
]


def main():
    out = {"about": "Engine hashes of blocks with extra keys (LoRA name, cache salt, "
                    "multimodal items), made by make_extra_keys_vectors.py with CPython's "
                    "pickle, hashlib, cbor2 and xxhash. extra_keys per block: its LoRA "
                    "name, multimodal (identifier, offset) pairs and salt, or null for "
                    "None. prompt_len: tokens hashed at request creation; later blocks "
                    "are completed by generated tokens.",
           "cases": []}
    for c in CASES:
        for algo in ALGOS:
            root, blocks = run(c, algo)
            v = dict(c)
            v["name"] = c["name"] + "_" + algo
            v["algo"] = algo
            v["root_digest"] = root.hex()
            v["blocks"] = blocks
            out["cases"].append(v)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
