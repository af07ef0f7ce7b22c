#!/usr/bin/env python3
"""Adds a random multi-token-prediction (MTP) head to the tiny qwen3_next and qwen3_5 fixtures,
with an independent reference of the drafts it makes.

transformers runs no MTP head (its Qwen3-Next / Qwen3.5 classes drop `mtp.*` tensors on load);
vLLM does. This script follows vLLM (vllm-project/vllm):

- vllm/model_executor/models/qwen3_next_mtp.py (`Qwen3NextMultiTokenPredictor.forward`) and
  vllm/model_executor/models/qwen3_5_mtp.py (`Qwen3_5MultiTokenPredictor.forward`, the same
  computation and the same checkpoint names):
      e = pre_fc_norm_embedding(embed_tokens(input_ids))
      h = pre_fc_norm_hidden(hidden_states)          # the target's final, normed hidden state
      x = fc(cat([e, h], -1))                         # fc: Linear(2H -> H), no bias
      x = layers[0](positions, x)                     # a full-attention decoder layer
      g = norm(x)                                     # mtp.norm (zero-centred RMSNorm)
      logits = lm_head(g)                             # the target model's lm_head
- vllm/v1/spec_decode/eagle.py (`EagleProposer.propose`): the MTP input ids are the target's ids
  shifted left by one with the newly sampled token last, the positions and hidden states are
  the target's unshifted. So for committed tokens t_0..t_{n-1} (target hidden states
  h_0..h_{n-1}) and a newly sampled t_n, the MTP runs over the pairs (t_{i+1}, h_i) at rotary
  position i, i = 0..n-1, attending causally over its own keys/values of positions 0..i;
  draft d_1 = argmax of its logits at position n-1. Draft d_2: the pair (d_1, g_{n-1}) at
  position n, g_{n-1} being the MTP's own output (after mtp.norm) at position n-1.

The decoder layer inside the head is transformers' own class (Qwen3NextDecoderLayer /
Qwen3_5DecoderLayer, built with a config copy whose layer_types marks index num_hidden_layers
as "full_attention"), so its math is transformers'; the embedding, norms, fc and the position
bookkeeping above are written here. The head is recomputed over the whole pair sequence with a
causal mask at every draft step (no cache), which is exact.

What it does, for each of qwen3_next and qwen3_5 under OUT:

1. loads the model that scripts/reference/tiny_architectures.py wrote (it must have run
   first: rerunning that script rewrites model.safetensors without the head) and checks it
   still reproduces reference.json;
2. draws the MTP weights from a seeded generator with tiny_architectures.perturb (the same
   distributions as the rest of the model), trying seeds from MTP_SEED_START until the
   smallest top-1/top-2 logit gap over every draft step is above 1e-3 (and, for the MoE
   head, the router's k-th/(k+1)-th logit margin too);
3. rewrites model.safetensors with every existing tensor unchanged plus the head, in the
   checkpoints' names (`mtp.fc.weight` [H, 2H], `mtp.pre_fc_norm_embedding.weight`,
   `mtp.pre_fc_norm_hidden.weight`, `mtp.norm.weight`, `mtp.layers.0.*` as a full-attention
   decoder layer with one tensor per expert), metadata {"format": "pt"}; config.json is not
   touched (the engine finds the head by its tensors);
4. adds the key "mtp" to reference.json (the other keys stay byte-for-byte): for each case and
   each of its 12 greedy steps j, the 2 drafts the head makes when the committed sequence is
   prompt + greedy[:j] and greedy[j] is the newly sampled token, their log-probabilities
   (log_softmax of the MTP logits, float32) and the smallest top-2 logit gap.

The target hidden states are `output_hidden_states=True`'s last element of a no-cache forward
over prompt + greedy[:j]; in transformers 5.17 that element is the output of the final
model.norm (capture_outputs ties it to last_hidden_state), and the script checks that it equals
model.norm applied to the last decoder layer's output and differs from that raw output.

CI never runs this script; the Rust tests read its files. Pinned versions: torch 2.15.0,
transformers 5.17.0, safetensors 0.8.0, numpy 2.4.6 (CPU, float32, eager attention, eager
experts). Run, after tiny_architectures.py:

    /work/venv-ref/bin/python scripts/reference/mtp_reference.py tests/fixtures/architectures

Reruns give the same bytes (an earlier head and "mtp" key are replaced).
"""

import argparse
import copy
import json
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
import transformers
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn
from transformers.masking_utils import create_causal_mask

sys.path.insert(0, str(Path(__file__).resolve().parent))
import tiny_architectures as ta  # noqa: E402

SCRIPT = "scripts/reference/mtp_reference.py"
MODELS = ("qwen3_next", "qwen3_5")
DRAFT_TOKENS = 2
MTP_SEED_START = 100_000  # away from the small seeds the target models use
MAX_SEEDS = 5000
MIN_TOP2_GAP = 1e-3
MIN_ROUTER_GAP = 1e-3
VLLM_SOURCES = [
    "vllm/model_executor/models/qwen3_next_mtp.py",
    "vllm/model_executor/models/qwen3_5_mtp.py",
    "vllm/v1/spec_decode/eagle.py",
]


class MultiTokenPredictor(nn.Module):
    """The head's parameters, named as in the checkpoints without the `mtp.` prefix."""

    def __init__(self, target):
        super().__init__()
        config = copy.deepcopy(target.config)
        layer_idx = config.num_hidden_layers  # vLLM's mtp_start_layer_idx
        config.layer_types = list(config.layer_types) + ["full_attention"]
        config._attn_implementation = "eager"
        config._experts_implementation = "eager"
        self.config = config  # tiny_architectures.perturb reads tie_word_embeddings
        hidden = config.hidden_size
        norm_class = type(target.model.norm)  # zero-centred (1 + w) RMSNorm
        layer_class = type(target.model.layers[0])
        self.fc = nn.Linear(2 * hidden, hidden, bias=False)
        self.pre_fc_norm_embedding = norm_class(hidden, eps=config.rms_norm_eps)
        self.pre_fc_norm_hidden = norm_class(hidden, eps=config.rms_norm_eps)
        self.layers = nn.ModuleList([layer_class(config, layer_idx)])
        self.norm = norm_class(hidden, eps=config.rms_norm_eps)
        if self.layers[0].block_type != "full_attention":
            raise RuntimeError("the MTP layer is not a full-attention layer")
        self.to(torch.float32).eval()


def rope_position_ids(target, positions):
    """Position ids as the target model's rotary embedding takes them (Qwen3.5's text model
    expands them to the 3 M-RoPE sections, all equal for text)."""
    pos = positions[None]
    if isinstance(target, transformers.Qwen3_5ForCausalLM):
        return pos[None].expand(3, 1, -1)
    return pos


@torch.no_grad()
def run_layer(target, layer, config, x, positions):
    """One decoder layer over x [1, L, H] at `positions` [L], causal, no cache: the same
    rotary embedding, mask and call as the target model's forward."""
    pos = positions[None]
    position_embeddings = target.model.rotary_emb(x, rope_position_ids(target, positions))
    mask = create_causal_mask(config=config, inputs_embeds=x, attention_mask=None,
                              past_key_values=None, position_ids=pos)
    if mask is None:
        raise RuntimeError("expected an explicit causal mask for eager attention")
    return layer(x, position_embeddings=position_embeddings, attention_mask=mask, position_ids=pos)


@torch.no_grad()
def mtp_forward(target, mtp, tokens, hidden, positions):
    """vLLM's Qwen3NextMultiTokenPredictor.forward + compute_logits (see the docstring).
    tokens [L], hidden [L, H] (target final normed hidden states), positions [L].
    Returns the head's output hidden states g [L, H] (after mtp.norm) and logits [L, V]."""
    embeds = mtp.pre_fc_norm_embedding(target.model.embed_tokens(tokens[None]))
    hidden = mtp.pre_fc_norm_hidden(hidden[None])
    x = mtp.fc(torch.cat([embeds, hidden], dim=-1))
    # vLLM's layer returns (mlp_out, residual) and mtp.norm(x, residual) normalises their sum;
    # transformers' layer returns the sum itself.
    x = run_layer(target, mtp.layers[0], mtp.config, x, positions)
    g = mtp.norm(x)
    logits = target.lm_head(g)
    return g[0], logits[0].float()


class TargetHidden:
    """The target model's final normed hidden states for a token sequence (no cache)."""

    def __init__(self, target):
        self.target = target
        self.cache = {}
        self.checked = 0

    @torch.no_grad()
    def __call__(self, ids):
        key = tuple(ids)
        if key not in self.cache:
            raw = []
            handle = self.target.model.layers[-1].register_forward_hook(
                lambda _m, _i, out: raw.append(out[0] if isinstance(out, tuple) else out))
            try:
                out = self.target(torch.tensor([ids]), use_cache=False, output_hidden_states=True)
            finally:
                handle.remove()
            last = out.hidden_states[-1][0]
            normed = self.target.model.norm(raw[0])[0]
            # hidden_states[-1] is after model.norm, not the last layer's raw output.
            if not torch.equal(last, normed) or torch.allclose(last, raw[0][0], atol=1e-3):
                raise RuntimeError("hidden_states[-1] is not model.norm(last layer output)")
            self.checked += 1
            self.cache[key] = (last.clone(), out.logits[0].float(), raw[0][0].clone())
        return self.cache[key]


def router_hook(mtp, log):
    layer = mtp.layers[0]
    if not hasattr(layer.mlp, "experts"):
        return None
    return layer.mlp.gate.register_forward_hook(
        lambda _m, _i, out: log.append(out[0].detach().clone()))


@torch.no_grad()
def compute_drafts(target, mtp, cases, target_hidden):
    """reference.json's "mtp" cases for this head, with statistics."""
    router_log = []
    handle = router_hook(mtp, router_log)
    out_cases = []
    stats = {"d1_hits": 0, "d1_total": 0, "d2_hits": 0, "d2_total": 0, "max_prefix_diff": 0.0}
    try:
        for case in cases:
            prompt, greedy = case["prompt"], case["greedy"]
            drafts, logprobs, gaps = [], [], []
            for j in range(len(greedy)):
                committed = prompt + greedy[:j]
                n = len(committed)
                hidden, target_logits, _raw = target_hidden(committed)
                if int(target_logits[-1].argmax()) != greedy[j]:
                    raise RuntimeError("the target's hidden states do not predict greedy[j]")
                tokens = torch.tensor((committed + [greedy[j]])[1:])  # t_1 .. t_n
                g, logits = mtp_forward(target, mtp, tokens, hidden, torch.arange(n))
                step_logits = [logits[n - 1]]
                step_drafts = [int(logits[n - 1].argmax())]
                for _ in range(1, DRAFT_TOKENS):
                    # The next pair: (last draft, the head's own output at the last position).
                    tokens = torch.cat([tokens, torch.tensor(step_drafts[-1:])])
                    hidden = torch.cat([hidden, g[-1:]])
                    length = tokens.shape[0]
                    g_next, logits_next = mtp_forward(target, mtp, tokens, hidden, torch.arange(length))
                    stats["max_prefix_diff"] = max(
                        stats["max_prefix_diff"], (logits_next[:-1] - logits).abs().max().item())
                    g, logits = g_next, logits_next
                    step_logits.append(logits[-1])
                    step_drafts.append(int(logits[-1].argmax()))
                drafts.append(step_drafts)
                logprobs.append(ta.floats(torch.stack(
                    [F.log_softmax(l, dim=-1)[d] for l, d in zip(step_logits, step_drafts)])))
                gaps.extend(float(ta.top2_gaps(l)) for l in step_logits)
                for k, d in enumerate(step_drafts):
                    if j + 1 + k < len(greedy):
                        stats[f"d{k + 1}_hits"] += int(d == greedy[j + 1 + k])
                        stats[f"d{k + 1}_total"] += 1
            out_cases.append({"drafts": drafts, "draft_logprobs": logprobs, "min_top2_gap": min(gaps)})
    finally:
        if handle is not None:
            handle.remove()
    if router_log:
        top_k = mtp.layers[0].mlp.gate.top_k
        sorted_logits = torch.cat(router_log).sort(dim=-1, descending=True).values
        stats["min_router_gap"] = (sorted_logits[:, top_k - 1] - sorted_logits[:, top_k]).min().item()
    return out_cases, stats


def build_mtp(target, seed):
    mtp = MultiTokenPredictor(target)
    ta.perturb(mtp, seed)
    return mtp


def find_mtp(target, cases, target_hidden):
    for seed in range(MTP_SEED_START, MTP_SEED_START + MAX_SEEDS):
        mtp = build_mtp(target, seed)
        mtp_cases, stats = compute_drafts(target, mtp, cases, target_hidden)
        gap = min(c["min_top2_gap"] for c in mtp_cases)
        if gap > MIN_TOP2_GAP and stats.get("min_router_gap", math.inf) > MIN_ROUTER_GAP:
            return seed, mtp, mtp_cases, stats
    raise RuntimeError(f"no MTP seed in {MAX_SEEDS} tries passes the checks")


def checkpoint_tensors(mtp):
    """The head's tensors in the checkpoints' names: `mtp.` + parameter name, experts split
    into one tensor per expert (gate rows 0..I of gate_up_proj, up rows I..2I)."""
    out = {}
    for name, tensor in mtp.state_dict().items():
        tensor = tensor.detach().to(torch.float32)
        if name.endswith("mlp.experts.gate_up_proj"):
            base = name[: -len("gate_up_proj")]
            inter = tensor.shape[1] // 2
            for e in range(tensor.shape[0]):
                out[f"mtp.{base}{e}.gate_proj.weight"] = tensor[e, :inter].contiguous()
                out[f"mtp.{base}{e}.up_proj.weight"] = tensor[e, inter:].contiguous()
        elif name.endswith("mlp.experts.down_proj"):
            base = name[: -len("down_proj")]
            for e in range(tensor.shape[0]):
                out[f"mtp.{base}{e}.down_proj.weight"] = tensor[e].contiguous()
        else:
            out[f"mtp.{name}"] = tensor.contiguous()
    return out


def mtp_from_file(target, path):
    """A head loaded back from the checkpoint names (experts re-fused)."""
    mtp = MultiTokenPredictor(target)
    with safe_open(path, "pt") as f:
        tensors = {k[len("mtp."):]: f.get_tensor(k) for k in f.keys() if k.startswith("mtp.")}
    state = {}
    for name, param in mtp.state_dict().items():
        if name.endswith("mlp.experts.gate_up_proj"):
            base = name[: -len("gate_up_proj")]
            state[name] = torch.stack([
                torch.cat([tensors.pop(f"{base}{e}.gate_proj.weight"),
                           tensors.pop(f"{base}{e}.up_proj.weight")])
                for e in range(param.shape[0])])
        elif name.endswith("mlp.experts.down_proj"):
            base = name[: -len("down_proj")]
            state[name] = torch.stack([tensors.pop(f"{base}{e}.down_proj.weight")
                                       for e in range(param.shape[0])])
        else:
            state[name] = tensors.pop(name)
    if tensors:
        raise RuntimeError(f"unused head tensors in {path}: {sorted(tensors)}")
    mtp.load_state_dict(state, strict=True)
    return mtp


def check_expert_layout(target, path):
    """save_pretrained's per-expert tensors are gate rows 0..I / up rows I..2I of the fused
    in-memory gate_up_proj: the split checkpoint_tensors uses."""
    for i, layer in enumerate(target.model.layers):
        if not hasattr(layer.mlp, "experts"):
            continue
        fused = layer.mlp.experts.gate_up_proj
        inter = fused.shape[1] // 2
        with safe_open(path, "pt") as f:
            gate = f.get_tensor(f"model.layers.{i}.mlp.experts.0.gate_proj.weight")
            up = f.get_tensor(f"model.layers.{i}.mlp.experts.0.up_proj.weight")
        if not (torch.equal(gate, fused[0, :inter]) and torch.equal(up, fused[0, inter:])):
            raise RuntimeError("unexpected expert layout")
        return


def read_safetensors(path):
    with safe_open(path, "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()


def check_layer_plumbing(target, reference):
    """run_layer on the target's own full-attention layer (index 3) reproduces that layer's
    output in reference.json's layer_outputs (case 0): the rotary embedding, mask and call
    that mtp_forward uses are the model's."""
    prompt = reference["cases"][0]["prompt"]
    index = target.config.layer_types.index("full_attention")
    hidden = torch.tensor(reference["layer_outputs"][index - 1]).view(1, len(prompt), -1)
    out = run_layer(target, target.model.layers[index], target.config, hidden,
                    torch.arange(len(prompt)))
    expected = torch.tensor(reference["layer_outputs"][index]).view(1, len(prompt), -1)
    diff = (out - expected).abs().max().item()
    if diff > 1e-4:
        raise RuntimeError(f"run_layer differs from the model's layer {index} by {diff}")
    return diff


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path, help="fixtures folder (tests/fixtures/architectures)")
    parser.add_argument("--only", nargs="*", choices=list(MODELS), help="only these models")
    args = parser.parse_args()

    if transformers.__version__ != ta.REQUIRED_TRANSFORMERS:
        sys.exit(f"transformers {ta.REQUIRED_TRANSFORMERS} is required, found {transformers.__version__}")
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    prompts = ta.make_prompts()

    for name in args.only or MODELS:
        directory = args.out / name
        weights = directory / "model.safetensors"
        reference_path = directory / "reference.json"
        reference_text = reference_path.read_text()
        reference = json.loads(reference_text)
        if ta.format_json(reference) + "\n" != reference_text:
            raise RuntimeError(f"{reference_path} does not round-trip through format_json")
        reference.pop("mtp", None)  # an earlier run's
        if [c["prompt"] for c in reference["cases"]] != prompts:
            raise RuntimeError(f"{reference_path}: prompts differ from tiny_architectures'")

        target = ta.load(name, directory)
        for param in target.parameters():  # fresh aligned memory, not the memory-mapped file
            param.data = param.data.clone()
        check_expert_layout(target, weights)
        plumbing_diff = check_layer_plumbing(target, reference)

        target_hidden = TargetHidden(target)
        seed, mtp, mtp_cases, stats = find_mtp(target, reference["cases"], target_hidden)

        # model.safetensors: every existing tensor unchanged, plus the head.
        existing, metadata = read_safetensors(weights)
        if metadata != {"format": "pt"}:
            raise RuntimeError(f"{weights}: metadata {metadata}")
        kept = {k: v for k, v in existing.items() if not k.startswith("mtp.")}
        head = checkpoint_tensors(mtp)
        save_file({**kept, **head}, weights, metadata={"format": "pt"})
        written, metadata = read_safetensors(weights)
        if metadata != {"format": "pt"} or written.keys() != kept.keys() | head.keys():
            raise RuntimeError(f"{weights}: unexpected tensors after writing")
        for k, v in kept.items():
            if v.dtype != written[k].dtype or v.shape != written[k].shape or \
                    v.contiguous().view(torch.uint8).ne(written[k].contiguous().view(torch.uint8)).any():
                raise RuntimeError(f"{weights}: {k} changed")

        # The head read back from the file drafts the same tokens and values.
        reloaded_cases, _ = compute_drafts(target, mtp_from_file(target, weights),
                                           reference["cases"], target_hidden)
        if reloaded_cases != mtp_cases:
            raise RuntimeError(f"{name}: the head read back from {weights} drafts differently")

        # transformers still loads the model (ignoring mtp.*) and reproduces reference.json.
        reloaded_reference = ta.compute_reference(ta.load(name, directory), prompts)[0]
        reloaded_diff = ta.assert_same_reference(reference, reloaded_reference, f"{name} with head")

        reference["mtp"] = {
            "tokens": DRAFT_TOKENS,
            "made_by": {
                "script": SCRIPT,
                "torch": torch.__version__,
                "transformers": transformers.__version__,
                "python": sys.version.split()[0],
                "seed": seed,
                "follows": VLLM_SOURCES,
            },
            "cases": mtp_cases,
        }
        new_text = ta.format_json(reference) + "\n"
        if not reference_text.startswith(new_text[: new_text.index('  "mtp": {')].rstrip(",\n")):
            raise RuntimeError(f"{reference_path}: the existing keys would change")
        reference_path.write_text(new_text)

        summary = (
            f"{name}: MTP seed {seed}, min draft top-2 gap "
            f"{min(c['min_top2_gap'] for c in mtp_cases):.4f}"
            + (f", router gap {stats['min_router_gap']:.4f}" if "min_router_gap" in stats else "")
            + f", d1 = next greedy {stats['d1_hits']}/{stats['d1_total']}"
            + f", d2 = greedy after {stats['d2_hits']}/{stats['d2_total']}"
            + f", prefix diff {stats['max_prefix_diff']:.1e}, layer plumbing diff {plumbing_diff:.1e}"
            + f", hidden states checked after norm {target_hidden.checked}"
            + f", reloaded model diff {reloaded_diff:.1e}, head tensors {len(head)}"
        )
        print(summary)


if __name__ == "__main__":
    main()
