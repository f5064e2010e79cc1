"""Native llama.cpp as a Spec-Bench peer: its own tools, run as its users run them, on the target's GGUF.

`make peers` builds the tools (specdecode.bench.llama_cpp_build); `specdecode bench specbench --llama-cpp-native`
then adds three arms, each a fresh process per prompt with 2 threads (torch's count), greedy (--temp 0
--top-k 1), on the same prompt text as our arms (our chat template applied, passed raw in a file with
conversation mode and escape processing off, so no second template and no rewriting of backslashes):

- plain: `llama-completion`;
- prompt lookup: `llama-lookup --spec-draft-n-max K` (K: our n-gram arm's, else 3, llama.cpp's default);
- draft model: `llama-speculative-simple -md DRAFT.gguf --spec-type draft-simple --spec-draft-n-max K` (the
  loop llama-server runs; this version needs the type named; K: our draft arm's, else 5), with our --draft, our
  draft arm's, or the target's default draft (the 1.5B's 0.5B).

Figures come from the tools' own timing lines, model loading excluded: whole request = prompt evaluation +
decoding (what our arms time), and decoding alone, plus drafted and accepted tokens for the speculative arms.
Like the llama-cpp-python arms (llama_cpp_peer), these run llama.cpp's arithmetic, not the exact target.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from specdecode.bench.lib import Arm, Sample, draft_name
from specdecode.bench.llama_cpp_build import TOOLS, bin_dir
from specdecode.bench.llama_cpp_peer import arithmetic_note, target_gguf
from specdecode.config import ConfigError

LOOKUP_K, DRAFT_K = 3, 5  # llama.cpp's default draft length, and the draft arm's when ours gives none


@dataclass(frozen=True)
class NativeTiming:
    """One request as a llama.cpp tool reports it: generated tokens, ms of prompt evaluation and of decoding,
    and for speculative tools the drafted and accepted tokens."""

    prompt_tokens: int
    tokens: int
    decode_tokens: int  # those `decode_ms` made: llama-completion's first comes from the prompt's forward
    prompt_ms: float
    decode_ms: float
    drafted: int = 0
    accepted: int = 0

    def sample(self) -> Sample:
        seconds = (self.prompt_ms + self.decode_ms) / 1e3
        # Greedy: each target forward commits its accepted draft tokens plus one of its own.
        forwards = self.tokens - self.accepted
        return Sample(
            self.tokens, seconds, self.drafted, self.accepted, forwards,
            decode_seconds=self.decode_ms / 1e3, decode_tokens=self.decode_tokens,
        )  # fmt: skip


_NUM = r"([0-9]+(?:\.[0-9]+)?)"


def _find(pattern: str, text: str, what: str) -> re.Match:
    m = re.search(pattern, text, re.MULTILINE)
    if m is None:
        raise ValueError(f"llama.cpp output has no {what} line")
    return m


def parse_completion(log: str) -> NativeTiming:
    """llama-completion's `common_perf_print` lines. Its first token comes from the prompt's forward and each
    later one from a one-token forward ('eval time = X ms / N runs'), so it made N + 1 tokens; decoding is the
    eval time plus the sampler's ('sampling time', every token's)."""
    prompt = _find(rf"prompt eval time =\s*{_NUM} ms /\s*(\d+) tokens", log, "prompt eval time")
    evals = _find(rf"(?<!prompt )eval time =\s*{_NUM} ms /\s*(\d+) runs", log, "eval time")
    sampling = _find(rf"sampling time =\s*{_NUM} ms", log, "sampling time")
    return NativeTiming(
        prompt_tokens=int(prompt[2]),
        tokens=int(evals[2]) + 1,
        decode_tokens=int(evals[2]),
        prompt_ms=float(prompt[1]),
        decode_ms=float(evals[1]) + float(sampling[1]),
    )


def parse_speculative(log: str) -> NativeTiming:
    """llama-lookup's and llama-speculative(-simple)'s summary: 'encoded N tokens in S seconds' (the prompt),
    'decoded N tokens in S seconds' (the rest, drafting included), 'n_drafted = ', 'n_accept = '."""
    enc = _find(rf"encoded\s+(\d+) tokens in\s+{_NUM} seconds", log, "encoded")
    dec = _find(rf"decoded\s+(\d+) tokens in\s+{_NUM} seconds", log, "decoded")
    return NativeTiming(
        prompt_tokens=int(enc[1]),
        tokens=int(dec[1]),
        decode_tokens=int(dec[1]),  # the prompt's last token is decoded in this part (lookup: sampled from it)
        prompt_ms=1e3 * float(enc[2]),
        decode_ms=1e3 * float(dec[2]),
        drafted=int(_find(r"n_drafted\s*=\s*(\d+)", log, "n_drafted")[1]),
        accepted=int(_find(r"n_accept\s*=\s*(\d+)", log, "n_accept")[1]),
    )


def tool(name: str) -> Path:
    """The built tool, or a ConfigError naming `make peers`."""
    path = bin_dir() / name
    if not path.is_file():
        raise ConfigError(f"native llama.cpp tool {name} is not built (looked in {bin_dir()}): run make peers")
    return path


def require(target: str) -> Path:
    """The target's GGUF, once every tool the arms run is known to be built: checked before any model loads."""
    try:
        path = target_gguf(target)
    except ConfigError:
        raise ConfigError(f"--llama-cpp-native needs a GGUF-backed target (a built-in name or a .gguf file), "
                          f"and {target} has no GGUF") from None  # fmt: skip
    for name in TOOLS:
        tool(name)
    return path


NO_REPACK = "--no-repack"  # ggml's extra weight buffers (AMX tiles, repacked CPU layouts) off


def common_args(gguf: Path, prompt_file: Path, max_tokens: int, threads: int, n_ctx: int) -> list[str]:
    return [
        "-m", str(gguf), "-f", str(prompt_file), "-n", str(max_tokens), "-c", str(n_ctx),
        "-t", str(threads), "-tb", str(threads), "--temp", "0", "--top-k", "1", "--seed", "0",
        "--no-escape", "-b", str(n_ctx),
    ]  # fmt: skip


class NativeArm:
    """One llama.cpp tool as a bench arm: a process per request, the figures from its own timing lines. Each
    request runs `timing`; `run` gives the bench its Sample."""

    def __init__(self, name: str, binary: Path, gguf: Path, extra: list[str], note: str, n_ctx: int) -> None:
        self.name, self.binary, self.gguf, self.extra, self.note, self.n_ctx = name, binary, gguf, extra, note, n_ctx
        self.speculative = binary.name != "llama-completion"  # the others print the speculative summary
        self.threads = torch.get_num_threads()

    def command(self, prompt_file: Path, max_tokens: int) -> list[str]:
        return [str(self.binary), *common_args(self.gguf, prompt_file, max_tokens, self.threads, self.n_ctx),
                *self.extra]  # fmt: skip

    def run(self, text: str, max_tokens: int) -> Sample:
        return self.timing(text, max_tokens).sample()

    def timing(self, text: str, max_tokens: int) -> NativeTiming:
        code, log = self._run(text, max_tokens)
        if code < 0 and NO_REPACK not in self.extra:
            self._repack_off(-code)
            code, log = self._run(text, max_tokens)
        if code != 0:
            raise RuntimeError(f"{self.name}: {self.binary.name} exited {code}: {log[-2000:]}")
        return parse_speculative(log) if self.speculative else parse_completion(log)

    def _run(self, text: str, max_tokens: int) -> tuple[int, str]:
        """The tool on `text`: its exit status (negative: the signal that killed it) and its output."""
        with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8") as f:
            f.write(text + "\n")  # `-f` drops the file's last newline: this one, so the text's own stays
            f.flush()
            proc = subprocess.run(
                self.command(Path(f.name), max_tokens),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                errors="replace",
                timeout=3600,
            )
        return proc.returncode, proc.stdout + proc.stderr

    def _repack_off(self, signal: int) -> None:
        """The tool died of `signal`: from now on it runs with ggml's weight repacking off, as its users on such a
        CPU do, and the arm's note says so. This llama.cpp's AMX matmul (a repacked buffer) segfaults on an
        Intel Xeon with AMX (seen 2026-12-05: llama-completion, and llama-bench on prompts, 2 threads)."""
        print(f"{self.name}: {self.binary.name} died of signal {signal}; running it with {NO_REPACK} from now on",
              file=sys.stderr)  # fmt: skip
        self.extra = [*self.extra, NO_REPACK]
        self.note = f"{self.note}; {NO_REPACK} (with repacking the tool died of signal {signal} on this CPU)"


def _ks(ours: list, method: str, default: int) -> list[int]:
    return sorted({llm.spec.num_speculative_tokens for llm in ours if llm.spec.method == method}) or [default]


def draft_ggufs(a: argparse.Namespace, ours: list) -> list[str]:
    """The drafts a native draft-model arm runs with: our draft arms', --draft, else the target's default
    draft; only those with a GGUF of their own (SmolLM2's shipped draft has none: no native draft arm)."""
    from specdecode.models.shipped_draft import DEFAULT_DRAFTS

    drafts = {llm.spec.draft for llm in ours if llm.spec.method == "draft" and llm.spec.draft}
    drafts |= {a.draft} if getattr(a, "draft", None) else set()
    if not drafts and a.target in DEFAULT_DRAFTS:
        drafts.add(DEFAULT_DRAFTS[a.target])
    usable = []
    for draft in sorted(drafts):
        try:
            target_gguf(draft)
            usable.append(draft)
        except ConfigError:
            print(f"llama.cpp native: draft {draft} has no GGUF file, so no native draft-model arm", file=sys.stderr)
    return usable


def native_arms(a: argparse.Namespace, gguf: Path, ours: list) -> list[Arm]:
    """'llama.cpp native', 'llama.cpp native lookup K=k' and, with a draft model (--draft or a draft arm's),
    'llama.cpp native draft[name] K=k' on the target's GGUF."""
    note = "native tools; " + arithmetic_note(gguf)
    n_ctx = a.max_model_len or 8192
    arms: list[Arm] = [NativeArm("llama.cpp native", tool("llama-completion"), gguf, ["-no-cnv"], note, n_ctx)]
    for k in _ks(ours, "ngram", LOOKUP_K):
        lookup = ["--spec-draft-n-max", str(k)]
        arms.append(NativeArm(f"llama.cpp native lookup K={k}", tool("llama-lookup"), gguf, lookup, note, n_ctx))
    for draft in draft_ggufs(a, ours):
        for k in _ks(ours, "draft", DRAFT_K):
            extra = ["-md", str(target_gguf(draft)), "--spec-type", "draft-simple", "--spec-draft-n-max", str(k)]
            name = f"llama.cpp native draft[{draft_name(draft)}] K={k}"
            arms.append(NativeArm(name, tool("llama-speculative-simple"), gguf, extra, note, n_ctx))
    return arms
