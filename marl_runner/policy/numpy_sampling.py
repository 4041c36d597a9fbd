"""Categorical sampling in numpy, for a CPU policy's per-round call.

In the runner's loop each small torch op costs ~10-20 us (the env step has
just evicted the caches) against ~1-3 us for the same numpy op on a few
hundred rows, so on CPU the Discrete head's post-model work (mask,
Gumbel-max draw, log-softmax of the chosen action) runs here on the
logits' numpy view. Same distribution and formulas as
``CategoricalHead``, so :meth:`TorchPolicy.evaluate` agrees with the
stored log-probs; the draws come from a numpy PCG64 generator.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["NumpyCategoricalSampler"]

# Same lowest finite float as the torch heads give masked logits (no NaNs from 0 * -inf).
_FLOAT_MIN = np.finfo(np.float32).min
# Uniform draws are clamped to it so that their log is finite.
_TINY = np.finfo(np.float32).tiny
# PCG64's state as a uint64 array: state (high, low word), inc (high, low), has_uint32, uinteger.
_STATE_WORDS = 6
# Row counts whose index array is kept (a few in practice: the rounds' policy batch sizes).
_MAX_ROW_COUNTS = 64
_WORD = (1 << 64) - 1


class NumpyCategoricalSampler:
    """Actions, log-probs and masked logits of a Discrete space from ``[n, k]`` logits.

    ``seed`` seeds the generator (None: fresh OS entropy). :meth:`get_state`
    is a uint64 array (numeric, so a checkpoint stores it as a plain array);
    :meth:`set_state` also takes a torch generator's byte state, as policies
    saved before this sampler stored, and seeds from it.
    """

    def __init__(self, num_actions: int, start: int, seed: int | None) -> None:
        self.start = start
        self._ones = np.ones(num_actions, dtype=np.float32)
        self.rng = np.random.Generator(np.random.PCG64(seed))
        self._rows: dict[int, np.ndarray] = {}

    def act(
        self, logits: np.ndarray, mask: np.ndarray | None, explore: bool
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(actions [n], logp [n], dist_inputs [n, k])`` as ``CategoricalHead.act`` gives them.

        Exploring draws by Gumbel-max, as the torch head does: ``logits -
        log(-log(u))`` with uniforms ``u`` clamped to the smallest normal
        float. Masked entries are set to -inf after the noise, so they never
        win; ``mask`` must allow some action in every row
        (``check_action_mask`` makes sure of it).
        """
        dist_inputs = logits if mask is None else np.where(mask, logits, _FLOAT_MIN)
        if explore:
            # Uniform draws and two logs cost less than exponential (ziggurat) draws and
            # one log from ~100 rows on, and give the torch head's formula.
            noise = self.rng.random(logits.shape, dtype=np.float32)
            np.maximum(noise, _TINY, out=noise)
            np.log(noise, out=noise)
            np.negative(noise, out=noise)
            np.log(noise, out=noise)
            scores = np.subtract(logits, noise, out=noise)
        else:
            scores = logits
        if mask is not None:
            scores = np.where(mask, scores, -np.inf)
        index = scores.argmax(axis=1)
        # log_softmax of the chosen entry, (x_a - s) - log(sum(exp(x - s))), shifted by the
        # chosen logit itself (s = x_a): greedy, it is the row's max; exploring, the clamped
        # noise spans [-16.7, 4.5], so x_a >= max - 21.2 and exp(x - x_a) <= e**21.2 stays
        # finite in float32. One gather instead of a second argmax and two gathers; the sum
        # over a short last axis as a product with ones (numpy's sum loops row by row there,
        # ~11 us at 256 x 5).
        chosen = dist_inputs[self._row_indices(len(index)), index]
        # A chosen -inf (every allowed logit -inf, a diverged model) shifts by the lowest
        # float instead, so that its logp is -inf as torch gives it, not -inf - -inf = NaN.
        shift = np.maximum(chosen, _FLOAT_MIN)
        shifted = np.subtract(dist_inputs, shift[:, None])
        np.exp(shifted, out=shifted)
        # errstate: OpenBLAS kernels can leave the CPU's invalid-operation flag set on finite
        # inputs (numpy issue 24067), which numpy then reports as a warning now and then;
        # and a row of only -inf logits sums to 0. Silent as torch is: a real NaN (a
        # diverged model's logits) still shows in logp.
        with np.errstate(invalid="ignore", divide="ignore"):
            normaliser = np.log(np.dot(shifted, self._ones))
            np.subtract(chosen, shift, out=chosen)  # 0, or -inf for a chosen -inf
            # (chosen - shift) - normaliser: a certain action's logp is +0.0, as torch's.
            logp = np.subtract(chosen, normaliser, out=normaliser)
        return (index + self.start if self.start else index), logp, dist_inputs

    def _row_indices(self, num_rows: int) -> np.ndarray:
        """``arange(num_rows)``, made once per row count (read-only: it is shared)."""
        rows = self._rows.get(num_rows)
        if rows is None:
            if len(self._rows) >= _MAX_ROW_COUNTS:
                self._rows.clear()
            rows = self._rows[num_rows] = np.arange(num_rows)
            rows.flags.writeable = False
        return rows

    def get_state(self) -> np.ndarray:
        """The generator's state as ``uint64[6]``; :meth:`set_state` restores it exactly."""
        state = self.rng.bit_generator.state
        words = (
            state["state"]["state"] >> 64,
            state["state"]["state"] & _WORD,
            state["state"]["inc"] >> 64,
            state["state"]["inc"] & _WORD,
            state["has_uint32"],
            state["uinteger"],
        )
        return np.array(words, dtype=np.uint64)

    def set_state(self, state: Any) -> None:
        """Restores :meth:`get_state`'s array, or seeds from an older torch generator state.

        A torch state (uint8 bytes) cannot be continued by a numpy generator,
        so it seeds one: the same saved state always gives the same draws.
        """
        array = np.asarray(state)
        if array.dtype == np.uint8 and array.ndim == 1 and array.size:
            self.rng = np.random.Generator(np.random.PCG64(array.astype(np.uint32)))
            return
        if array.dtype != np.uint64 or array.shape != (_STATE_WORDS,):
            raise ValueError(
                f"sampler_rng_state has dtype {array.dtype} and shape {array.shape}; expected "
                f"uint64 ({_STATE_WORDS},) (a numpy PCG64 state, as get_state saves it) or a "
                "1-D uint8 torch generator state"
            )
        words = [int(word) for word in array]
        self.rng.bit_generator.state = {
            "bit_generator": "PCG64",
            "state": {"state": words[0] << 64 | words[1], "inc": words[2] << 64 | words[3]},
            "has_uint32": words[4],
            "uinteger": words[5],
        }
