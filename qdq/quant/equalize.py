"""Cross-layer equalization: the arithmetic, on the weights of a chain of convolutions.

One power-of-two scale per weight tensor (the NPU) cannot serve output channels whose ranges
differ a hundredfold (depthwise convolutions after BatchNorm folding): the small channels round
to a few steps or to zero. Between two convolutions A → B through an activation `f` with
f(x / s) = f(x) / s for s > 0 (Relu, LeakyRelu, PRelu, none), dividing A's output channel i
(its weights and bias) by s_i and multiplying B's input channel i by s_i computes the same
function in float (Nagel et al. 2019, "Data-free quantization through weight equalization and
bias correction"). s_i = sqrt(r_A,i / r_B,i), with r the channel's largest |weight|, gives both
the same range sqrt(r_A,i · r_B,i); along a chain the pairs are equalized in turn until the
factors settle.

What is not exact is the quantization: the weights go onto new per-tensor grids, and the
per-tensor activation grid between A and B now holds channels divided by s_i. `objective` puts
both in one number, the expected squared error they add to B's output, so a chain is changed
only where that number comes down (docs/equalization.md gives the model and its assumptions).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# Symmetric int8 weights: the grid the NPU's weights take (QDQ503's symmetric zero-point 0).
WEIGHT_QMAX = 127


@dataclass
class Link:
    """What sits between two convolutions of a chain: the activation values on B's input channels.

    `amplitude` is each channel's largest |value|, measured (`--calibrate`) or modelled
    (`amplitudes`), `step` the per-tensor step of the activation grid (the Q before B) in the
    input model.
    """

    amplitude: np.ndarray
    step: float

    def grid_move(self, factors_: np.ndarray) -> float:
        """ρ, the factor the activation grid's range moves by when channel i is divided by s_i:
        the largest channel after the move over the largest before."""
        largest = float(self.amplitude.max()) if self.amplitude.size else 0.0
        if largest <= 0:
            return 1.0
        return float((self.amplitude / factors_).max() / largest)


def input_channels(shape: tuple[int, ...], group: int) -> np.ndarray:
    """For a Conv weight [Cout, Cin/group, k...]: the input channel each [o, j] entry reads."""
    cout, per_group = shape[0], shape[1]
    outputs_per_group = cout // group
    return (np.arange(cout) // outputs_per_group)[:, None] * per_group + np.arange(per_group)[None, :]


def scale_inputs(weight: np.ndarray, group: int, factors: np.ndarray) -> np.ndarray:
    """The weight with input channel c multiplied by factors[c]."""
    multiplier = factors[input_channels(weight.shape, group)]
    return weight * multiplier.reshape(multiplier.shape + (1,) * (weight.ndim - 2))


def scale_outputs(weight: np.ndarray, factors: np.ndarray) -> np.ndarray:
    """The weight with output channel o multiplied by factors[o]."""
    return weight * factors.reshape((-1,) + (1,) * (weight.ndim - 1))


def _per_input(weight: np.ndarray, group: int, reduce: np.ufunc) -> np.ndarray:
    """`reduce` (maximum or add) of |w| (add: w²) over everything input channel c reads."""
    channels = input_channels(weight.shape, group)
    cin = channels.shape[1] * group
    spatial = tuple(range(2, weight.ndim))
    per_entry = np.abs(weight).max(axis=spatial) if reduce is np.maximum else np.square(weight).sum(axis=spatial)
    out = np.zeros(cin)
    reduce.at(out, channels.ravel(), per_entry.ravel())
    return out


def input_ranges(weight: np.ndarray, group: int) -> np.ndarray:
    return _per_input(weight, group, np.maximum)


def input_gains(weight: np.ndarray, group: int) -> np.ndarray:
    """Σ w² over each input channel's weights: the power a unit error on that channel adds to the output."""
    return _per_input(weight, group, np.add)


def output_ranges(weight: np.ndarray) -> np.ndarray:
    return np.abs(weight).reshape(weight.shape[0], -1).max(axis=1)


def pow2_grid(weight: np.ndarray) -> tuple[np.ndarray, float]:
    """Symmetric int8 integers on the per-tensor power-of-two grid that clips nothing, and its scale
    (the grid QDQ504's default `ceil` rounding gives the largest value)."""
    largest = float(np.abs(weight).max()) if weight.size else 0.0
    scale = float(np.exp2(np.ceil(np.log2(largest / WEIGHT_QMAX)))) if largest > 0 else 1.0
    return np.clip(np.rint(weight / scale), -WEIGHT_QMAX - 1, WEIGHT_QMAX), scale


def factors(weights: list[np.ndarray], groups: list[int], iterations: int, max_factor: float) -> list[np.ndarray]:
    """Per link, the factor each channel between conv k and k+1 is divided by, equalizing their ranges.

    The pairs are equalized in turn, as often as `iterations` or until no factor moves by 0.1 %;
    a factor is kept within [1/max_factor, max_factor] (a channel of zeros gets 1).
    """
    current = [w.astype(np.float64) for w in weights]
    total = [np.ones(w.shape[0]) for w in weights[:-1]]
    for _ in range(iterations):
        moved = 0.0
        for k in range(len(total)):
            r_a, r_b = output_ranges(current[k]), input_ranges(current[k + 1], groups[k + 1])
            s = np.ones_like(r_a)
            both = (r_a > 0) & (r_b > 0)
            s[both] = np.sqrt(r_a[both] / r_b[both])
            s = np.clip(s * total[k], 1 / max_factor, max_factor) / total[k]
            total[k] *= s
            current[k] = scale_outputs(current[k], 1 / s)
            current[k + 1] = scale_inputs(current[k + 1], groups[k + 1], s)
            moved = max(moved, float(np.max(np.abs(np.log(s)))))
        if moved < 1e-3:
            break
    return total


def scaled(weights: list[np.ndarray], groups: list[int], links: list[np.ndarray]) -> list[np.ndarray]:
    """The chain's weights with link k's channels divided by links[k] (after conv k, before conv k+1)."""
    out = []
    for k, weight in enumerate(weights):
        w = weight.astype(np.float64)
        if k > 0:
            w = scale_inputs(w, groups[k], links[k - 1])
        if k < len(links):
            w = scale_outputs(w, 1 / links[k])
        out.append(w)
    return out


def objective(weights: list[np.ndarray], groups: list[int], links: list[Link], factors_: list[np.ndarray]) -> float:
    """The expected squared error the per-tensor grids add to the chain's outputs, with these factors.

    Per link A → B, in the input model's units, with channel i's values of amplitude a_i:
    A's relative error on output channel i times a_i², through B's gain on that channel; B's
    error on input channel i times a_i²; the activation grid's rounding (step ρ·Δ, ρ the
    factor the grid's range moves by, is s_i·ρ·Δ on channel i in the input's units) through B.
    """
    errors = [_error_in_input_units(w, q, groups, factors_, k)
              for k, (w, q) in enumerate(zip(weights, scaled(weights, groups, factors_)))]
    total = 0.0
    for k, link in enumerate(links):
        a, b, s = weights[k].astype(np.float64), weights[k + 1].astype(np.float64), factors_[k]
        power = link.amplitude ** 2
        gain = input_gains(b, groups[k + 1])
        norm_a = np.square(a).reshape(a.shape[0], -1).sum(axis=1)
        relative_a = np.divide(np.square(errors[k]).reshape(a.shape[0], -1).sum(axis=1), norm_a,
                               out=np.zeros_like(norm_a), where=norm_a > 0)
        step = link.step * link.grid_move(s) * s
        total += float(np.sum(relative_a * power * gain))
        total += float(np.sum(input_gains(errors[k + 1], groups[k + 1]) * power))
        total += float(np.sum(step ** 2 / 12 * gain))
    return total


def _error_in_input_units(weight: np.ndarray, equalized: np.ndarray, groups: list[int], links: list[np.ndarray],
                          k: int) -> np.ndarray:
    """Conv k's rounding error on its per-tensor grid, mapped back to the input model's units."""
    integers, step = pow2_grid(equalized)
    back = integers * step
    if k > 0:
        back = scale_inputs(back, groups[k], 1 / links[k - 1])
    if k < len(links):
        back = scale_outputs(back, links[k])
    return back - weight



def amplitudes(weight: np.ndarray, bias: np.ndarray | None, largest: float) -> np.ndarray:
    """Without data, each output channel's amplitude modelled as |b_i| + k·‖w_i‖₂ (inputs alike across
    channels), k chosen so the largest channel reaches `largest`, the range the graph's Q gives the tensor."""
    norms = np.sqrt(np.square(weight.astype(np.float64)).reshape(weight.shape[0], -1).sum(axis=1))
    offsets = np.abs(bias.astype(np.float64)) if bias is not None else np.zeros_like(norms)
    if largest <= offsets.max() or not norms.any():
        return np.maximum(offsets, 1e-12 * max(largest, 1e-30))
    low, high = 0.0, (largest - offsets.min()) / norms[norms > 0].min()
    for _ in range(60):  # max_i(|b_i| + k·n_i) grows with k: bisect for `largest`
        middle = (low + high) / 2
        low, high = (middle, high) if (offsets + middle * norms).max() < largest else (low, middle)
    return offsets + high * norms
