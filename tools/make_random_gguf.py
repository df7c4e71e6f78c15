#!/usr/bin/env python3
"""make_random_gguf.py - a random Llama-3.2-1B-shaped GGUF for CPU speed tests.

Usage: make_random_gguf.py TEMPLATE.gguf OUT.gguf q4km|q5km|q3km|q8|bf16 [1b|8b|moe|q35moe]

Design: lumen and llama.cpp both need GGUF files to compare speed on, and
make_random_model writes safetensors only. This copies the metadata of a small
llama GGUF (TEMPLATE: e.g. ../shared/fixtures/gguf/llama-g256/model.Q4_K_M.gguf)
with the shape keys set to Llama-3.2-1B's (16 layers, 2048 wide, FFN 8192,
32 heads / 8 KV heads, vocab 128256: the token list is padded with unused
tokens) and writes random weight blocks: q4km follows llama.cpp's Q4_K_M
choice (Q4_K, with Q6_K for the output and for attn_v / ffn_down in 8 of the
16 layers), q5km the same with Q5_K for Q4_K, q3km with Q3_K for Q4_K
and Q4_K for Q6_K (the output too), q8 is all Q8_0, bf16 is all BF16 with the head tied to the
embedding (no output.weight), as llama.cpp's converter writes the real
Llama-3.2-1B (to compare with make_random_model's bf16 safetensors). Block scales are fixed, sane f16 values (no
subnormals, no infinities) and the codes random, so the logits are
meaningless but finite; 4096 random blocks are repeated to keep this fast.
Only the Python standard library is used. Output: ~0.95 GB (q4km), ~1.6 GB (q8), ~2.5 GB (bf16).
With `8b` the shape is Llama-3.1-8B's (32 layers, 4096 wide, FFN 14336, 32
heads / 8 KV heads of 128): ~4.9 GB (q4km), the GPU decode benchmark's file.
With `moe` (TEMPLATE a qwen3moe GGUF, e.g. tests/data/gguf/qwen3moe-g256/
model.Q4_K_M.gguf) the shape is Qwen3-30B-A3B's layers (2048 wide, 32 heads
/ 4 KV heads of 128, q/k norms, 128 experts of FFN 768, top 8, vocab 151936)
but 8 of its 48 layers: ~3.0 GB (q4km); the routers are random f32 so that
tokens pick different experts.
With `q35moe` (TEMPLATE a qwen35 GGUF, e.g. ../shared/fixtures/gguf/
qwen3.5-g256/model.Q4_K_M.gguf) the shape is Qwen3.5-35B-A3B's layers
(qwen35moe: 2048 wide; Gated DeltaNet layers of 16 key / 32 value heads of
128, full attention every 4th with 16 heads / 2 KV heads of 256 and output
gate; 256 experts of FFN 512, top 8, a shared expert of 512; vocab 248320)
but 8 of its 40 layers: ~4.5 GB (q4km).
"""
import os
import random
import struct
import sys

TF = {0: 'B', 1: 'b', 2: 'H', 3: 'h', 4: 'I', 5: 'i', 6: 'f', 7: '?', 10: 'Q', 11: 'q', 12: 'd'}


def rd_str(f):
    n, = struct.unpack('<Q', f.read(8))
    return f.read(n).decode('utf-8', 'replace')


def rd_val(f, t):
    if t == 8:
        return rd_str(f)
    if t == 9:
        at, n = struct.unpack('<IQ', f.read(12))
        return ('arr', at, [rd_val(f, at) for _ in range(n)])
    fm = TF[t]
    return struct.unpack('<' + fm, f.read(struct.calcsize(fm)))[0]


def read_kv(path):
    with open(path, 'rb') as f:
        assert f.read(4) == b'GGUF', path + ': not a GGUF file'
        _, _, nkv = struct.unpack('<IQQ', f.read(20))
        kv = []
        for _ in range(nkv):
            k = rd_str(f)
            t, = struct.unpack('<I', f.read(4))
            kv.append((k, t, rd_val(f, t)))
        return kv


def s(x):
    b = x.encode()
    return struct.pack('<Q', len(b)) + b


def val(t, v):
    if t == 8:
        return s(v)
    if t == 9:
        return struct.pack('<IQ', v[1], len(v[2])) + b''.join(val(v[1], x) for x in v[2])
    return struct.pack('<' + TF[t], v)


def main():
    if len(sys.argv) not in (4, 5) or sys.argv[3] not in ('q4km', 'q5km', 'q3km', 'q8', 'bf16') or sys.argv[4:] not in ([], ['1b'], ['8b'], ['moe'], ['q35moe']):
        sys.exit(__doc__)
    tmpl, out, kind = sys.argv[1:4]
    moe = sys.argv[4:] == ['moe']
    q35 = sys.argv[4:] == ['q35moe']
    H, L, F, NH, NKV, V = (4096, 32, 14336, 32, 8, 128256) if sys.argv[4:] == ['8b'] else (2048, 16, 8192, 32, 8, 128256)
    HD, E, K, FM = H // NH, 0, 0, 0
    if moe:
        H, L, F, NH, NKV, V, HD, E, K, FM = 2048, 8, 6144, 32, 4, 151936, 128, 128, 8, 768
    if q35:
        H, L, F, NH, NKV, V, HD, E, K, FM = 2048, 8, 512, 16, 2, 248320, 256, 256, 8, 512
        HK, HV, DK, DV = 16, 32, 128, 128
    KVD = NKV * HD
    rng = random.Random(1)
    f16 = lambda x: struct.pack('<e', x)
    rb = lambda n: bytes(rng.getrandbits(8) for _ in range(n))

    def chunk(t):  # 4096 random blocks of ggml type t
        if t == 12:
            return b''.join(f16(4e-5) + f16(2e-5) + rb(140) for _ in range(4096))
        if t == 13:  # Q5_K: Q4_K's header, then qh and qs
            return b''.join(f16(4e-5) + f16(2e-5) + rb(172) for _ in range(4096))
        if t == 11:  # Q3_K: hmask, qs, 12 scale bytes, then d
            return b''.join(rb(108) + f16(2e-5) for _ in range(4096))
        if t == 14:
            return b''.join(rb(192) + bytes(rng.randrange(-60, 60) & 255 for _ in range(16)) + f16(1e-5)
                            for _ in range(4096))
        if t == 30:  # bf16 of magnitude 2^-6 .. 2^-5, random sign and mantissa
            return b''.join(struct.pack('<H', (rng.getrandbits(1) << 15) | (121 << 7) | rng.getrandbits(7))
                            for _ in range(4096 * 16))
        return b''.join(f16(3e-4) + rb(32) for _ in range(4096))

    blocks = {11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210), 8: (32, 34), 0: (1, 4), 30: (1, 2)}
    q4, q6 = {'q4km': (12, 14), 'q5km': (13, 14), 'q3km': (11, 12), 'q8': (8, 8), 'bf16': (30, 30)}[kind]
    q8b = 8 if kind != 'bf16' else 30  # narrow matrices (32 rows): Q8_0, as llama-quantize leaves them
    w = lambda name, rows, cols, t, n=1: (name, (cols, rows) if n == 1 else (cols, rows, n), t)
    tensors = [w('token_embd.weight', V, H, q4), w('output_norm.weight', 1, H, 0)]
    if kind != 'bf16':
        tensors.append(w('output.weight', V, H, q6))
    for i in range(L):
        more = i < L // 8 or i >= 7 * L // 8 or (i - L // 8) % 3 == 2
        p = 'blk.%d.' % i
        if q35:
            tensors += [w(p + 'attn_norm.weight', 1, H, 0), w(p + 'post_attention_norm.weight', 1, H, 0)]
            if (i + 1) % 4 == 0:  # full attention, q rows with the output gate
                tensors += [w(p + 'attn_q.weight', 2 * NH * HD, H, q4), w(p + 'attn_k.weight', KVD, H, q4),
                            w(p + 'attn_v.weight', KVD, H, q6 if more else q4),
                            w(p + 'attn_output.weight', H, NH * HD, q4),
                            w(p + 'attn_q_norm.weight', 1, HD, 0), w(p + 'attn_k_norm.weight', 1, HD, 0)]
            else:
                C = 2 * HK * DK + HV * DV
                tensors += [w(p + 'attn_qkv.weight', C, H, q4), w(p + 'attn_gate.weight', HV * DV, H, q4),
                            w(p + 'ssm_conv1d.weight', C, 4, 'router'), w(p + 'ssm_dt.bias', 1, HV, 0),
                            w(p + 'ssm_a', 1, HV, 'neg'), w(p + 'ssm_beta.weight', HV, H, q8b),
                            w(p + 'ssm_alpha.weight', HV, H, q8b), w(p + 'ssm_norm.weight', 1, DV, 0),
                            w(p + 'ssm_out.weight', H, HV * DV, q4)]
            tensors += [w(p + 'ffn_gate_inp.weight', E, H, 'router'),
                        w(p + 'ffn_gate_exps.weight', FM, H, q4, E), w(p + 'ffn_up_exps.weight', FM, H, q4, E),
                        w(p + 'ffn_down_exps.weight', H, FM, q6 if more else q4, E),
                        w(p + 'ffn_gate_inp_shexp.weight', 1, H, 'router'),
                        w(p + 'ffn_gate_shexp.weight', F, H, q4), w(p + 'ffn_up_shexp.weight', F, H, q4),
                        w(p + 'ffn_down_shexp.weight', H, F, q6 if more else q4)]
            continue
        if moe:
            tensors += [w(p + 'attn_norm.weight', 1, H, 0), w(p + 'ffn_norm.weight', 1, H, 0),
                        w(p + 'attn_q.weight', NH * HD, H, q4), w(p + 'attn_k.weight', KVD, H, q4),
                        w(p + 'attn_v.weight', KVD, H, q6 if more else q4),
                        w(p + 'attn_output.weight', H, NH * HD, q4),
                        w(p + 'attn_q_norm.weight', 1, HD, 0), w(p + 'attn_k_norm.weight', 1, HD, 0),
                        w(p + 'ffn_gate_inp.weight', E, H, 'router'),
                        w(p + 'ffn_gate_exps.weight', FM, H, q4, E), w(p + 'ffn_up_exps.weight', FM, H, q4, E),
                        w(p + 'ffn_down_exps.weight', H, FM, q6 if more else q4, E)]
            continue
        tensors += [w(p + 'attn_norm.weight', 1, H, 0), w(p + 'ffn_norm.weight', 1, H, 0),
                    w(p + 'attn_q.weight', H, H, q4), w(p + 'attn_k.weight', KVD, H, q4),
                    w(p + 'attn_v.weight', KVD, H, q6 if more else q4), w(p + 'attn_output.weight', H, H, q4),
                    w(p + 'ffn_gate.weight', F, H, q4), w(p + 'ffn_up.weight', F, H, q4),
                    w(p + 'ffn_down.weight', H, F, q6 if more else q4)]
    a = 'qwen3moe.' if moe else 'qwen35moe.' if q35 else 'llama.'
    over = {a + 'block_count': L, a + 'embedding_length': H, a + 'feed_forward_length': F,
            a + 'attention.head_count': NH, a + 'attention.head_count_kv': NKV, a + 'vocab_size': V,
            'general.file_type': {'q4km': 15, 'q5km': 17, 'q3km': 12, 'q8': 7, 'bf16': 32}[kind], a + 'attention.key_length': HD,
            a + 'attention.value_length': HD, a + 'rope.dimension_count': HD,
            a + 'expert_count': E, a + 'expert_used_count': K, a + 'expert_feed_forward_length': FM}
    if sys.argv[4:] == ['8b']:
        over[a + 'context_length'] = 131072  # Llama-3.1-8B's, so that servers can take 32k prompts
    if q35:
        over.update({a + 'ssm.conv_kernel': 4, a + 'ssm.state_size': DK, a + 'ssm.group_count': HK,
                     a + 'ssm.time_step_rank': HV, a + 'ssm.inner_size': HV * DV, a + 'full_attention_interval': 4,
                     a + 'rope.dimension_count': HD // 4, 'general.architecture': 'qwen35moe'})
    extra = [(a + 'expert_count', 4, E), (a + 'expert_used_count', 4, K), (a + 'expert_feed_forward_length', 4, FM),
             (a + 'expert_shared_feed_forward_length', 4, F)] if q35 else []
    kvb = []
    for k, t, v in read_kv(tmpl) + extra:
        if q35 and k.startswith('qwen35.'):
            k = 'qwen35moe.' + k[len('qwen35.'):]
        v = over.get(k, v)
        if k == 'tokenizer.ggml.tokens':
            v = ('arr', 8, v[2] + ['<pad_%d>' % i for i in range(V - len(v[2]))])
        if k == 'tokenizer.ggml.token_type':
            v = ('arr', 5, v[2] + [1] * (V - len(v[2])))
        kvb.append(s(k) + struct.pack('<I', t) + val(t, v))
    infos, sizes, off = [], [], 0
    for name, dims, t in tensors:
        blk, bb = blocks[0 if t in ('router', 'neg') else t]
        n = 1
        for d in dims:
            n *= d
        size = n // blk * bb
        infos.append(s(name) + struct.pack('<I', len(dims)) + b''.join(struct.pack('<Q', d) for d in dims) +
                     struct.pack('<IQ', 0 if t in ('router', 'neg') else t, off))
        sizes.append(size)
        off += (size + 31) // 32 * 32
    with open(out, 'wb') as f:
        f.write(b'GGUF' + struct.pack('<IQQ', 3, len(tensors), len(kvb)))
        for b in kvb + infos:
            f.write(b)
        f.write(b'\0' * ((-f.tell()) % 32))
        chunks = {}
        for (name, dims, t), size in zip(tensors, sizes):
            if t == 0:
                data = struct.pack('<f', 1.0) * (size // 4)
            elif t == 'neg':  # ssm_a holds -exp(A_log) < 0
                data = struct.pack('<f', -1.0) * (size // 4)
            elif t == 'router':  # random routers: each token picks its own experts
                data = struct.pack('<%df' % (size // 4), *(rng.uniform(-0.05, 0.05) for _ in range(size // 4)))
            else:
                c = chunks.setdefault(t, chunk(t))
                data = (c * (size // len(c) + 1))[:size]
            f.write(data)
            f.write(b'\0' * ((-size) % 32))
    print(out, os.path.getsize(out))


if __name__ == '__main__':
    main()
