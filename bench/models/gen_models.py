#!/usr/bin/env python3
"""Writes the parameter lists kolo-bench --model-step replays.

One tensor per line, "name count", in the model's registration order (the
order of torch's named_parameters()); kolo-bench submits them in reverse, as
a backward pass produces the gradients. The shapes come from the published
architectures, so no torch is needed:

  resnet50.txt    torchvision.models.resnet50(): 161 tensors, 25,557,032 parameters
  bert_large.txt  transformers.BertModel (bert-large: 24 layers, hidden 1024,
                  intermediate 4096, 16 heads, vocab 30522, max position 512,
                  type vocab 2) with its pooler: 391 tensors, 335,141,888 parameters
  vgg16.txt       torchvision.models.vgg16(): 32 tensors, 138,357,544 parameters
  resnet50.flops, vgg16.flops, bert_large.flops: each tensor's forward FLOPs (the compute
                  profile for kolo-bench --model-step --compute-profile; CNNs at 224x224,
                  BERT at 512 tokens, batch 1)

  python3 bench/models/gen_models.py            # rewrite the .txt files next to this script
  python3 bench/models/gen_models.py --check    # exit 1 if the committed files differ
"""
import argparse
import math
import os
import sys


def resnet50():
    """torchvision ResNet-50 (Bottleneck, layers [3, 4, 6, 3], expansion 4)."""
    params = []

    def conv(name, cin, cout, k):
        params.append((name + ".weight", (cout, cin, k, k)))

    def bn(name, c):
        params.append((name + ".weight", (c,)))
        params.append((name + ".bias", (c,)))

    conv("conv1", 3, 64, 7)
    bn("bn1", 64)
    inplanes = 64
    for layer, (blocks, width) in enumerate(zip([3, 4, 6, 3], [64, 128, 256, 512]), start=1):
        for b in range(blocks):
            p = "layer%d.%d" % (layer, b)
            conv(p + ".conv1", inplanes, width, 1)
            bn(p + ".bn1", width)
            conv(p + ".conv2", width, width, 3)
            bn(p + ".bn2", width)
            conv(p + ".conv3", width, width * 4, 1)
            bn(p + ".bn3", width * 4)
            if b == 0:
                conv(p + ".downsample.0", inplanes, width * 4, 1)
                bn(p + ".downsample.1", width * 4)
            inplanes = width * 4
    params.append(("fc.weight", (1000, 2048)))
    params.append(("fc.bias", (1000,)))
    return params


def bert_large(layers=24, hidden=1024, intermediate=4096, vocab=30522, max_pos=512, type_vocab=2):
    """Hugging Face BertModel (embeddings, encoder, pooler), bert-large sizes."""
    params = []

    def linear(name, cin, cout):
        params.append((name + ".weight", (cout, cin)))
        params.append((name + ".bias", (cout,)))

    def layer_norm(name, c):
        params.append((name + ".weight", (c,)))
        params.append((name + ".bias", (c,)))

    params.append(("embeddings.word_embeddings.weight", (vocab, hidden)))
    params.append(("embeddings.position_embeddings.weight", (max_pos, hidden)))
    params.append(("embeddings.token_type_embeddings.weight", (type_vocab, hidden)))
    layer_norm("embeddings.LayerNorm", hidden)
    for i in range(layers):
        p = "encoder.layer.%d" % i
        for proj in ("query", "key", "value"):
            linear(p + ".attention.self." + proj, hidden, hidden)
        linear(p + ".attention.output.dense", hidden, hidden)
        layer_norm(p + ".attention.output.LayerNorm", hidden)
        linear(p + ".intermediate.dense", hidden, intermediate)
        linear(p + ".output.dense", intermediate, hidden)
        layer_norm(p + ".output.LayerNorm", hidden)
    linear("pooler.dense", hidden, hidden)
    return params


def vgg16():
    """torchvision.models.vgg16() (configuration D, no batch norm): features.N are the Sequential's indices
    (each conv is followed by a ReLU, each 'M' is a max pool), classifier 25088 -> 4096 -> 4096 -> 1000."""
    params = []
    idx, cin = 0, 3
    for v in [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]:
        if v == "M":
            idx += 1
            continue
        params.append(("features.%d.weight" % idx, (v, cin, 3, 3)))
        params.append(("features.%d.bias" % idx, (v,)))
        idx += 2
        cin = v
    for i, (a, b) in zip((0, 3, 6), ((512 * 7 * 7, 4096), (4096, 4096), (4096, 1000))):
        params.append(("classifier.%d.weight" % i, (b, a)))
        params.append(("classifier.%d.bias" % i, (b,)))
    return params


def conv_flops(shape, hw):
    cout, cin, k, _ = shape
    return 2 * cout * cin * k * k * hw * hw


def resnet50_flops():
    """Forward FLOPs per weight tensor at 224x224 (batch 1); BN and biases 0 (their gradients come with the
    weight's). The backward pass costs about twice the forward, layer by layer, so the shares hold."""
    out = {"conv1.weight": conv_flops((64, 3, 7, 7), 112)}
    inplanes = 64
    for layer, (blocks, width, hw) in enumerate(zip([3, 4, 6, 3], [64, 128, 256, 512], [56, 28, 14, 7]), start=1):
        for b in range(blocks):
            p = "layer%d.%d" % (layer, b)
            in_hw = hw * 2 if (b == 0 and layer > 1) else hw  # torchvision v1.5: the stride is in conv2
            out[p + ".conv1.weight"] = conv_flops((width, inplanes, 1, 1), in_hw)
            out[p + ".conv2.weight"] = conv_flops((width, width, 3, 3), hw)
            out[p + ".conv3.weight"] = conv_flops((width * 4, width, 1, 1), hw)
            if b == 0:
                out[p + ".downsample.0.weight"] = conv_flops((width * 4, inplanes, 1, 1), hw)
            inplanes = width * 4
    out["fc.weight"] = 2 * 2048 * 1000
    return out


def vgg16_flops():
    out = {}
    hw, idx, cin = 224, 0, 3
    for v in [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]:
        if v == "M":
            idx += 1
            hw //= 2
            continue
        out["features.%d.weight" % idx] = conv_flops((v, cin, 3, 3), hw)
        idx += 2
        cin = v
    for i, (a, b) in zip((0, 3, 6), ((512 * 7 * 7, 4096), (4096, 4096), (4096, 1000))):
        out["classifier.%d.weight" % i] = 2 * a * b
    return out


def bert_large_flops(seq=512, layers=24, hidden=1024, intermediate=4096):
    """Forward FLOPs per weight tensor for one sequence of `seq` tokens: 2 x in x out per token for each
    linear layer; the attention's own matrix products (Q K^T and the weighted sum of V, 2 x seq^2 x hidden
    each, no parameters) go to the tensor whose gradient the backward pass reaches right after them
    (softmax(Q K^T) V to value.weight, Q K^T to key.weight). Embedding lookups, LayerNorm and biases 0; the
    pooler sees the first token only."""
    out = {}
    for i in range(layers):
        p = "encoder.layer.%d" % i
        for proj in ("query", "key", "value"):
            out[p + ".attention.self.%s.weight" % proj] = 2 * hidden * hidden * seq
        out[p + ".attention.self.value.weight"] += 2 * seq * seq * hidden
        out[p + ".attention.self.key.weight"] += 2 * seq * seq * hidden
        out[p + ".attention.output.dense.weight"] = 2 * hidden * hidden * seq
        out[p + ".intermediate.dense.weight"] = 2 * hidden * intermediate * seq
        out[p + ".output.dense.weight"] = 2 * intermediate * hidden * seq
    out["pooler.dense.weight"] = 2 * hidden * hidden
    return out


PROFILES = {"resnet50": (resnet50_flops, "224x224, batch 1"), "vgg16": (vgg16_flops, "224x224, batch 1"),
            "bert_large": (bert_large_flops, "512 tokens, batch 1")}


def render_profile(key):
    names = [n for n, _ in MODELS[key][0]()]
    fn, at = PROFILES[key]
    flops = fn()
    assert set(flops) <= set(names), set(flops) - set(names)
    lines = ["# %s: forward FLOPs per tensor at %s (generated by gen_models.py; %.2f GFLOPs in all)"
             % (key, at, sum(flops.values()) / 1e9),
             "# name weight   (kolo-bench --compute-profile: each gradient's share of --compute-ms;",
             "# tensors not listed (biases, normalisation, embeddings) weigh 0: their gradients come with the weight's)"]
    for n in names:
        if flops.get(n):
            lines.append("%s %d" % (n, flops[n]))
    return "\n".join(lines) + "\n"


MODELS = {
    "resnet50": (resnet50, "torchvision.models.resnet50()", 161, 25557032),
    "bert_large": (bert_large, "transformers.BertModel, bert-large (24 x 1024, 4096, vocab 30522)",
                   391, 335141888),
    "vgg16": (vgg16, "torchvision.models.vgg16()", 32, 138357544),
}


def render(key):
    fn, what, want_tensors, want_params = MODELS[key]
    params = fn()
    total = sum(math.prod(shape) for _, shape in params)
    if len(params) != want_tensors or total != want_params:
        raise SystemExit("%s: %d tensors, %d parameters; expected %d and %d"
                         % (key, len(params), total, want_tensors, want_params))
    lines = ["# %s: %d parameter tensors, %d parameters (generated by gen_models.py)"
             % (what, len(params), total),
             "# name count   (registration order; shape in the comment)"]
    for name, shape in params:
        lines.append("%s %d  # %s" % (name, math.prod(shape), "x".join(str(d) for d in shape)))
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--check", action="store_true", help="compare with the files instead of writing them")
    args = ap.parse_args()
    status = 0
    outputs = [(key + ".txt", lambda k=key: render(k)) for key in MODELS]
    outputs += [(key + ".flops", lambda k=key: render_profile(k)) for key in PROFILES]
    for name, make in outputs:
        path = os.path.join(args.out_dir, name)
        text = make()
        if args.check:
            try:
                with open(path) as f:
                    same = f.read() == text
            except OSError:
                same = False
            if not same:
                print("gen_models: %s is missing or out of date (rerun gen_models.py)" % path, file=sys.stderr)
                status = 1
        else:
            with open(path, "w") as f:
                f.write(text)
            print("wrote %s" % path)
    return status


if __name__ == "__main__":
    sys.exit(main())
