"""One verdict vocabulary for every command: ``fits``, ``tight``, ``oom``, ``host-oom`` (and the
doctor's ``invalid``), with the calibrated band each one stands for.

Why bands and not a yes/no: the memory model is right to within a few per cent on most published
runs, but below capacity it cannot tell a run that fits from one that runs out of memory at 95 %
(allocator fragmentation, CUDA context and NCCL by version; docs/prediction-accuracy.md). The
published corpus (bench/data/fit_outcomes.yaml) says where that zone starts, so a prediction is
read against it:

* ``fits``: predicted at or below the safe line, ``1 - memory_headroom`` at the spec's *default*
  headroom (the line the corpus calibrates; a user's own ``constraints.memory_headroom`` changes
  what the solver accepts, not what the evidence says);
* ``tight``: above the safe line and at or below capacity; it states the evidence of that band;
* ``oom``: predicted above GPU capacity;
* ``host-oom``: host RAM or NVMe over budget (checked first: it is a verdict on the whole node).

A ``tight`` verdict also says which way its evidence leans (:attr:`FitVerdict.likely`): the outcome
most published runs in its band had. Which runs count is the one thing a prediction cannot see:
runs whose samples are packed to the full length and whose allocator grows segments
(``training.packed_samples``; dsgen's launch scripts set ``expandable_segments``) are read against
the long-context corpus, where 12 of the 14 runs between the line and capacity fit; every other
run against the fit corpus, where all 6 ran out.

:data:`BANDS` holds the outcomes of the published runs in each band, as ``bench/fit_accuracy.py``
prints them (its ``calibration`` lines); ``tests/test_verdict.py`` re-derives them from the corpus
with ``dsgen doctor``'s own predictions, so they cannot drift from the data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from dsgen.spec.defaults import spec_default

#: What a prediction says about a run; ``invalid`` is the doctor's for a config DeepSpeed refuses.
Verdict = Literal["fits", "tight", "oom", "host-oom", "invalid"]
VERDICTS: tuple[Verdict, ...] = get_args(Verdict)

#: The safe line as a fill (predicted / capacity): below it the corpus's runs fit.
SAFE_LINE: float = 1.0 - float(spec_default("constraints.memory_headroom"))


@dataclass(frozen=True)
class Band:
    """Published runs whose dsgen doctor prediction fell in ``(low, high]`` of GPU capacity."""

    verdict: Verdict
    low: float
    high: float  # ``inf`` for the band above capacity
    runs: int
    gpu_oom: int  # of those, how many ran out of GPU memory
    runs_are: str = "published runs"
    corpus: str = "bench/data/fit_outcomes.yaml"

    @property
    def lean(self) -> Literal["fits", "oom"] | None:
        """The outcome most of this band's runs had (``None`` when they split evenly)."""
        ran = self.runs - self.gpu_oom
        if ran == self.gpu_oom:
            return None
        return "fits" if ran > self.gpu_oom else "oom"

    def evidence(self) -> str:
        """The sentence a user reads beside the verdict."""
        if self.high == float("inf"):
            where = f"above {self.low:.0%} of capacity"
        else:
            where = f"at {self.low:.0%}-{self.high:.0%} of capacity"
        return f"of the {self.runs} {self.runs_are} predicted {where}, {self.gpu_oom} ran out of GPU memory ({self.corpus})"

    def as_dict(self) -> dict[str, object]:
        return {
            "low": round(self.low, 4),
            "high": None if self.high == float("inf") else round(self.high, 4),
            "published_runs": self.runs,
            "published_gpu_oom": self.gpu_oom,
        }


#: Calibration on the 47 published runs of bench/data/fit_outcomes.yaml that the doctor does not
#: call host-oom (bench/fit_accuracy.py, "calibration" lines): two runs of 34 below the line ran out
#: of GPU memory, all 6 between the line and capacity, 6 of 7 above capacity.
BANDS: tuple[Band, ...] = (
    Band("fits", 0.0, SAFE_LINE, runs=34, gpu_oom=2),
    Band("tight", SAFE_LINE, 1.0, runs=6, gpu_oom=6),
    Band("oom", 1.0, float("inf"), runs=7, gpu_oom=6),
)


#: The same bands on the long-context corpus (bench/data/long_context_runs.yaml: ArcticTraining's
#: recipes, their commented-out tries and Hugging Face's Ulysses benchmark; bench/long_context_published.py
#: prints them as "outcomes by dsgen's predicted GPU fill"). Between the safe line and capacity those
#: runs mostly fit, where the short-sequence corpus's mostly ran out (docs/prediction-accuracy.md:
#: fixed-length packed samples and expandable segments leave little fragmentation). The bands, and so
#: the verdicts, stay the corpus's above; a long-context plan's evidence states both, and a packed
#: spec's tight verdict leans to these runs' majority (FitVerdict.likely).
_LONG_CONTEXT = {"runs_are": "published long-context runs", "corpus": "bench/data/long_context_runs.yaml"}
LONG_CONTEXT_BANDS: tuple[Band, ...] = (
    Band("fits", 0.0, SAFE_LINE, runs=40, gpu_oom=0, **_LONG_CONTEXT),
    Band("tight", SAFE_LINE, 1.0, runs=14, gpu_oom=2, **_LONG_CONTEXT),
    Band("oom", 1.0, float("inf"), runs=12, gpu_oom=11, **_LONG_CONTEXT),
)


#: The same bands on the published runs held out from that calibration (bench/data/fit_heldout.yaml
#: and the blind fit_heldout_strict.yaml and fit_heldout_blind3.yaml to fit_heldout_blind5.yaml;
#: bench/fit_accuracy.py --held-out prints each file's "calibration" lines, these are their sums).
#: Between the safe line and capacity 5 of those 11 runs ran out, against 6 of 6 in the calibration
#: corpus: a ``tight`` verdict states both, so the user reads the uncertainty the evidence has, not
#: the calibration corpus's alone.
_HELD_OUT = {"runs_are": "held-out published runs", "corpus": "bench/data/fit_heldout*.yaml"}
HELD_OUT_BANDS: tuple[Band, ...] = (
    Band("fits", 0.0, SAFE_LINE, runs=93, gpu_oom=18, **_HELD_OUT),
    Band("tight", SAFE_LINE, 1.0, runs=11, gpu_oom=5, **_HELD_OUT),
    Band("oom", 1.0, float("inf"), runs=52, gpu_oom=40, **_HELD_OUT),
)


#: Where "room to spare" ends below the safe line: the solver's tie rule (dsgen.search.ranking) prefers a
#: plan predicted at or below this fill to one between it and the safe line. Below the line the
#: published runs still split by fill: :data:`MARGIN_BANDS` holds their outcomes (calibration and
#: held-out corpora together, re-derived by tests/test_verdict.py): 14 of the 114 runs
#: predicted at or below 80 % ran out of GPU memory, 6 of the 13 between 80 % and 90 %.
ROOM_LINE: float = 0.80

_ALL_FIT = {"runs_are": "published runs (calibration and held out)", "corpus": "bench/data/fit_*.yaml"}
MARGIN_BANDS: tuple[Band, Band] = (
    Band("fits", 0.0, ROOM_LINE, runs=114, gpu_oom=14, **_ALL_FIT),
    Band("fits", ROOM_LINE, SAFE_LINE, runs=13, gpu_oom=6, **_ALL_FIT),
)


@dataclass(frozen=True)
class FitVerdict:
    """A verdict with the numbers behind it: ``fill`` is predicted GPU bytes / capacity."""

    verdict: Verdict
    fill: float
    band: Band | None  # None for host-oom and invalid
    long_context_band: Band | None = None  # the long-context corpus's band, for long-context plans
    packed_samples: bool = False  # the run is read against the long-context corpus (module docstring)

    @property
    def governing_band(self) -> Band | None:
        """The band whose runs this one is read against: the long-context corpus's for packed
        samples, else the fit corpus's (None for host-oom and invalid)."""
        if self.packed_samples and self.long_context_band is not None:
            return self.long_context_band
        return self.band

    @property
    def likely(self) -> Verdict:
        """What the evidence says will happen: the verdict itself, except that ``tight`` leans to
        the outcome most runs of its governing band had (``oom`` when they split evenly)."""
        if self.verdict != "tight":
            return self.verdict
        band = self.governing_band
        return "fits" if band is not None and band.lean == "fits" else "oom"

    @property
    def held_out_band(self) -> Band | None:
        """The held-out runs' counts in the same band (None for host-oom and invalid)."""
        return None if self.band is None else band_of(self.fill, HELD_OUT_BANDS)

    @property
    def evidence(self) -> str | None:
        held_out = self.held_out_band
        if self.band is None or held_out is None or self.verdict != "tight":
            return None
        parts = [self.band.evidence(), held_out.evidence()]
        if self.long_context_band is not None:
            parts.append(self.long_context_band.evidence())
        governing = self.governing_band
        assert governing is not None  # a GPU band exists, so a governing one does
        outcome = "fits" if self.likely == "fits" else "runs out of GPU memory"
        against = "packed samples" if governing is self.long_context_band else "samples not declared packed"
        parts.append(f"read against {governing.corpus} ({against}): likely {outcome}")
        return "; ".join(parts)

    @property
    def summary(self) -> str:
        """The verdict in one sentence with its evidence, what every command leads with."""
        band = self.governing_band
        if self.verdict == "host-oom":
            return "host-oom: the node's host RAM or NVMe is short of what the run needs"
        if self.verdict == "invalid":
            return "invalid: DeepSpeed or the HF Trainer refuses this config"
        assert band is not None
        where = f"predicted at {self.fill:.0%} of GPU memory"
        if self.verdict == "fits":
            trained = band.runs - band.gpu_oom
            return (
                f"fits: {where}, at or below the {SAFE_LINE:.0%} safe line, where {trained} of "
                f"{band.runs} {band.runs_are} trained"
            )
        if self.verdict == "tight":
            return (
                f"tight: {where}, above the {SAFE_LINE:.0%} safe line, where {band.gpu_oom} of "
                f"{band.runs} {band.runs_are} ran out of GPU memory"
            )
        return (
            f"oom: {where}, above capacity, where {band.gpu_oom} of {band.runs} {band.runs_are} ran out of GPU memory"
        )

    def as_dict(self) -> dict[str, object]:
        """The JSON every command carries: ``verdict``, ``fill`` and the band's edges (and, for a
        long-context plan, the long-context corpus's counts in the same band)."""
        return {
            "verdict": self.verdict,
            "fill": round(self.fill, 4),
            "band": self.band.as_dict() if self.band is not None else None,
            "held_out_band": self.held_out_band.as_dict() if self.held_out_band is not None else None,
            "long_context_band": self.long_context_band.as_dict() if self.long_context_band is not None else None,
            "safe_line": round(SAFE_LINE, 4),
            "likely": self.likely,
            "evidence": self.evidence,
            "summary": self.summary,
        }


def band_of(fill: float, bands: tuple[Band, ...] = BANDS) -> Band:
    """The calibrated band a GPU fill falls in (the safe line itself is ``fits``, capacity ``tight``)."""
    if fill <= SAFE_LINE:
        return bands[0]
    if fill <= 1.0:
        return bands[1]
    return bands[2]


def classify(
    gpu_total: int, gpu_capacity: int, host_ok: bool, long_context: bool = False, packed_samples: bool = False
) -> FitVerdict:
    """The verdict of a prediction: host-oom when the host or NVMe is short, else by GPU band;
    ``long_context`` (Ulysses, tiling or checkpoint offload) or ``packed_samples`` adds that corpus's
    band as evidence, and packed samples are read against it (:attr:`FitVerdict.likely`)."""
    fill = gpu_total / gpu_capacity if gpu_capacity else float("inf")
    if not host_ok:
        return FitVerdict("host-oom", fill, None)
    band = band_of(fill)
    long_band = band_of(fill, LONG_CONTEXT_BANDS) if long_context or packed_samples else None
    return FitVerdict(band.verdict, fill, band, long_band, packed_samples)


def invalid(fill: float | None = None) -> FitVerdict:
    """The doctor's verdict for a config DeepSpeed or the Trainer refuses."""
    return FitVerdict("invalid", fill if fill is not None else 0.0, None)
