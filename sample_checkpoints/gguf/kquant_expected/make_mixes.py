import sys, json, numpy as np, gguf, ctypes, llama_cpp, os
FT = {"Q2_K": 10, "Q3_K_S": 11, "Q3_K_M": 12, "Q3_K_L": 13, "Q4_K_S": 14, "Q4_K_M": 15, "Q5_K_S": 16, "Q5_K_M": 17, "Q6_K": 18}
def make(path, arch, n_layer, width, heads, heads_kv, tied, extra_w=None):
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(n_layer); w.add_context_length(64); w.add_embedding_length(width)
    w.add_feed_forward_length(width*2); w.add_head_count(heads); w.add_head_count_kv(heads_kv)
    w.add_layer_norm_rms_eps(1e-5); w.add_layer_norm_eps(1e-5); w.add_file_type(1)
    rng = np.random.default_rng(0)
    def t(name, shape):
        w.add_tensor(name, (rng.standard_normal(shape)*0.02).astype(np.float16))
    V = 512
    t("token_embd.weight", (V, width))
    if not tied: t("output.weight", (V, width))
    w.add_tensor("output_norm.weight", np.ones(width, np.float32))
    kvw = width * heads_kv // heads
    for i in range(n_layer):
        t(f"blk.{i}.attn_q.weight", (width, width)); t(f"blk.{i}.attn_k.weight", (kvw, width))
        t(f"blk.{i}.attn_v.weight", (kvw, width)); t(f"blk.{i}.attn_output.weight", (width, width))
        t(f"blk.{i}.ffn_gate.weight", (2*width, width)); t(f"blk.{i}.ffn_up.weight", (2*width, width))
        t(f"blk.{i}.ffn_down.weight", (width, 2*width))
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(width, np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
def quant(src, dst, ftype):
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = FT[ftype]; p.nthread = 2
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(p))
    assert rc == 0, rc
    r = gguf.GGUFReader(dst)
    return {t.name: t.tensor_type.name for t in r.tensors}, int(r.fields["general.file_type"].parts[-1][0])
if __name__ == "__main__":
    out = {}
    for case in json.loads(sys.argv[1]):
        src = f"/tmp/wtkq/syn_{case['id']}.gguf"
        make(src, case["arch"], case["n_layer"], case["width"], case["heads"], case["heads_kv"], case["tied"])
        out[case["id"]] = {"case": case, "mixes": {}}
        for ft in FT:
            types, ftv = quant(src, f"/tmp/wtkq/syn_{case['id']}_{ft}.gguf", ft)
            out[case["id"]]["mixes"][ft] = {"file_type": ftv, "types": types}
    json.dump(out, open(sys.argv[2], "w"), indent=1, sort_keys=True)
