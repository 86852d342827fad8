"""BibTeX for the papers and software whose equations and code a result used: `bibtex`,
`references`, `keys_for`.

Each theory package rests on one paper (``qkov``: Vashisht and Ramaswamy 2026; ``focus``:
Chen, Lin, Xu and Luo 2026; ``heads``: Sagitova, Duranthon and Zdeborová 2026;
``deeplinear``: Saxe, McClelland and Ganguli 2014; ``derive``: Saad and Solla 1995 with Goldt
et al. 2019); every package integrates with Diffrax and trains with Optax on JAX and Equinox.
An experiment that reads data also cites its data sets (`EXPERIMENT_KEYS`: HateXplain, SQuAD,
BLiMP for the qkov real-data experiments; Tiny Shakespeare and WikiText-2, the default corpora
of ``focus-corpus``). ``attnflow cite [NAME]`` prints the entries for an
experiment, a package or (without a name) everything a ``reproduce`` used.

```python
from attnflow.citations import bibtex, keys_for

print(bibtex(keys_for("qkov")))
```
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "ENTRIES",
    "EXPERIMENT_KEYS",
    "PACKAGE_KEYS",
    "SOFTWARE_KEYS",
    "bibtex",
    "experiment_keys",
    "keys_for",
    "references",
    "reproduce_keys",
]

# key -> (one-line reference for summaries, BibTeX entry)
ENTRIES: dict[str, tuple[str, str]] = {
    "vashisht2026faster": (
        "R. Vashisht, H. G. Ramaswamy. Faster Query-Key Learning Sharpens Attention in Self-Attention "
        "Models. ICML 2026, PMLR 306:123512-123537. arXiv:2608.06776.",
        """@inproceedings{vashisht2026faster,
  title     = {Faster Query-Key Learning Sharpens Attention in Self-Attention Models},
  author    = {Vashisht, R. and Ramaswamy, H. G.},
  booktitle = {Proceedings of the 43rd International Conference on Machine Learning},
  series    = {Proceedings of Machine Learning Research},
  volume    = {306},
  pages     = {123512--123537},
  year      = {2026},
  eprint    = {2608.06776},
  archivePrefix = {arXiv}
}""",
    ),
    "chen2026focus": (
        "Chen, Lin, Xu, Luo. Focus and Dilution: The Multi-stage Learning Process of Attention. "
        "ICML 2026. arXiv:2605.01199.",
        """@inproceedings{chen2026focus,
  title     = {Focus and Dilution: The Multi-stage Learning Process of Attention},
  author    = {Chen and Lin and Xu and Luo},
  booktitle = {Proceedings of the 43rd International Conference on Machine Learning},
  year      = {2026},
  eprint    = {2605.01199},
  archivePrefix = {arXiv}
}""",
    ),
    "sagitova2026specialization": (
        "M. Sagitova, O. Duranthon, L. Zdeborová. Specialization of softmax attention heads: insights "
        "from the high-dimensional single-location model. arXiv:2603.03993 (2026).",
        """@article{sagitova2026specialization,
  title   = {Specialization of softmax attention heads: insights from the high-dimensional
             single-location model},
  author  = {Sagitova, M. and Duranthon, O. and Zdeborov{\\'a}, L.},
  journal = {arXiv preprint arXiv:2603.03993},
  year    = {2026}
}""",
    ),
    "saxe2014exact": (
        "A. M. Saxe, J. L. McClelland, S. Ganguli. Exact solutions to the nonlinear dynamics of learning "
        "in deep linear neural networks. ICLR 2014. arXiv:1312.6120.",
        """@inproceedings{saxe2014exact,
  title     = {Exact solutions to the nonlinear dynamics of learning in deep linear neural networks},
  author    = {Saxe, Andrew M. and McClelland, James L. and Ganguli, Surya},
  booktitle = {International Conference on Learning Representations},
  year      = {2014},
  eprint    = {1312.6120},
  archivePrefix = {arXiv}
}""",
    ),
    "jax2018github": (
        "J. Bradbury et al. JAX: composable transformations of Python+NumPy programs (2018). "
        "https://github.com/jax-ml/jax",
        """@software{jax2018github,
  author = {James Bradbury and Roy Frostig and Peter Hawkins and Matthew James Johnson and Chris Leary
            and Dougal Maclaurin and George Necula and Adam Paszke and Jake Vander{P}las
            and Skye Wanderman-{M}ilne and Qiao Zhang},
  title  = {{JAX}: composable transformations of {P}ython+{N}um{P}y programs},
  url    = {https://github.com/jax-ml/jax},
  year   = {2018}
}""",
    ),
    "kidger2021equinox": (
        "P. Kidger, C. Garcia. Equinox: neural networks in JAX via callable PyTrees and filtered "
        "transformations. Differentiable Programming workshop, NeurIPS 2021.",
        """@article{kidger2021equinox,
  author  = {Patrick Kidger and Cristian Garcia},
  title   = {{E}quinox: neural networks in {JAX} via callable {P}y{T}rees and filtered transformations},
  journal = {Differentiable Programming workshop at Neural Information Processing Systems 2021},
  year    = {2021}
}""",
    ),
    "kidger2021on": (
        "P. Kidger. On Neural Differential Equations. PhD thesis, University of Oxford, 2021 (Diffrax).",
        """@phdthesis{kidger2021on,
  title  = {{O}n {N}eural {D}ifferential {E}quations},
  author = {Patrick Kidger},
  school = {University of Oxford},
  year   = {2021}
}""",
    ),
    "saad1995online": (
        "D. Saad, S. A. Solla. On-line learning in soft committee machines. Phys. Rev. E 52, 4225 (1995).",
        """@article{saad1995online,
  title   = {On-line learning in soft committee machines},
  author  = {Saad, David and Solla, Sara A.},
  journal = {Physical Review E},
  volume  = {52},
  number  = {4},
  pages   = {4225--4243},
  year    = {1995}
}""",
    ),
    "goldt2019dynamics": (
        "S. Goldt, M. S. Advani, A. M. Saxe, F. Krzakala, L. Zdeborová. Dynamics of stochastic gradient "
        "descent for two-layer neural networks in the teacher-student setup. NeurIPS 2019.",
        """@inproceedings{goldt2019dynamics,
  title     = {Dynamics of stochastic gradient descent for two-layer neural networks in the
               teacher-student setup},
  author    = {Goldt, Sebastian and Advani, Madhu S. and Saxe, Andrew M. and Krzakala, Florent and
               Zdeborov{\\'a}, Lenka},
  booktitle = {Advances in Neural Information Processing Systems},
  volume    = {32},
  year      = {2019}
}""",
    ),
    "deepmind2020jax": (
        "DeepMind. The DeepMind JAX Ecosystem (2020), Optax. https://github.com/google-deepmind/optax",
        """@software{deepmind2020jax,
  title  = {The {D}eep{M}ind {JAX} {E}cosystem},
  author = {DeepMind},
  url    = {https://github.com/google-deepmind},
  year   = {2020}
}""",
    ),
    "mathew2021hatexplain": (
        "B. Mathew, P. Saha, S. M. Yimam, C. Biemann, P. Goyal, A. Mukherjee. HateXplain: A Benchmark "
        "Dataset for Explainable Hate Speech Detection. AAAI 2021.",
        """@inproceedings{mathew2021hatexplain,
  title     = {{HateXplain}: A Benchmark Dataset for Explainable Hate Speech Detection},
  author    = {Mathew, Binny and Saha, Punyajoy and Yimam, Seid Muhie and Biemann, Chris and
               Goyal, Pawan and Mukherjee, Animesh},
  booktitle = {Proceedings of the AAAI Conference on Artificial Intelligence},
  volume    = {35},
  number    = {17},
  pages     = {14867--14875},
  year      = {2021}
}""",
    ),
    "rajpurkar2016squad": (
        "P. Rajpurkar, J. Zhang, K. Lopyrev, P. Liang. SQuAD: 100,000+ Questions for Machine "
        "Comprehension of Text. EMNLP 2016.",
        """@inproceedings{rajpurkar2016squad,
  title     = {{SQuAD}: 100,000+ Questions for Machine Comprehension of Text},
  author    = {Rajpurkar, Pranav and Zhang, Jian and Lopyrev, Konstantin and Liang, Percy},
  booktitle = {Proceedings of the 2016 Conference on Empirical Methods in Natural Language Processing},
  pages     = {2383--2392},
  year      = {2016}
}""",
    ),
    "warstadt2020blimp": (
        "A. Warstadt, A. Parrish, H. Liu, A. Mohananey, W. Peng, S.-F. Wang, S. R. Bowman. BLiMP: The "
        "Benchmark of Linguistic Minimal Pairs for English. TACL 8, 377-392 (2020).",
        """@article{warstadt2020blimp,
  title   = {{BLiMP}: The Benchmark of Linguistic Minimal Pairs for {English}},
  author  = {Warstadt, Alex and Parrish, Alicia and Liu, Haokun and Mohananey, Anhad and Peng, Wei and
             Wang, Sheng-Fu and Bowman, Samuel R.},
  journal = {Transactions of the Association for Computational Linguistics},
  volume  = {8},
  pages   = {377--392},
  year    = {2020}
}""",
    ),
    "linzen2016assessing": (
        "T. Linzen, E. Dupoux, Y. Goldberg. Assessing the Ability of LSTMs to Learn Syntax-Sensitive "
        "Dependencies. TACL 4, 521-535 (2016).",
        """@article{linzen2016assessing,
  title   = {Assessing the Ability of {LSTMs} to Learn Syntax-Sensitive Dependencies},
  author  = {Linzen, Tal and Dupoux, Emmanuel and Goldberg, Yoav},
  journal = {Transactions of the Association for Computational Linguistics},
  volume  = {4},
  pages   = {521--535},
  year    = {2016}
}""",
    ),
    "deyoung2020eraser": (
        "J. DeYoung, S. Jain, N. F. Rajani, E. Lehman, C. Xiong, R. Socher, B. C. Wallace. ERASER: A "
        "Benchmark to Evaluate Rationalized NLP Models. ACL 2020.",
        """@inproceedings{deyoung2020eraser,
  title     = {{ERASER}: A Benchmark to Evaluate Rationalized {NLP} Models},
  author    = {DeYoung, Jay and Jain, Sarthak and Rajani, Nazneen Fatema and Lehman, Eric and
               Xiong, Caiming and Socher, Richard and Wallace, Byron C.},
  booktitle = {Proceedings of the 58th Annual Meeting of the Association for Computational Linguistics},
  pages     = {4443--4458},
  year      = {2020}
}""",
    ),
    "karpathy2015charrnn": (
        "A. Karpathy. char-rnn: multi-layer recurrent neural networks for character-level language models "
        "(2015), whose Tiny Shakespeare corpus focus-corpus reads. https://github.com/karpathy/char-rnn",
        """@misc{karpathy2015charrnn,
  title  = {char-rnn: Multi-layer Recurrent Neural Networks ({LSTM}, {GRU}, {RNN}) for character-level
            language models in {T}orch},
  author = {Karpathy, Andrej},
  url    = {https://github.com/karpathy/char-rnn},
  year   = {2015}
}""",
    ),
    "merity2017pointer": (
        "S. Merity, C. Xiong, J. Bradbury, R. Socher. Pointer Sentinel Mixture Models. ICLR 2017. "
        "arXiv:1609.07843 (the WikiText-2 corpus).",
        """@inproceedings{merity2017pointer,
  title     = {Pointer Sentinel Mixture Models},
  author    = {Merity, Stephen and Xiong, Caiming and Bradbury, James and Socher, Richard},
  booktitle = {International Conference on Learning Representations},
  year      = {2017},
  eprint    = {1609.07843},
  archivePrefix = {arXiv}
}""",
    ),
}

# the paper each theory package implements
PACKAGE_KEYS: dict[str, tuple[str, ...]] = {
    "qkov": ("vashisht2026faster",),
    "focus": ("chen2026focus",),
    "heads": ("sagitova2026specialization",),
    "deeplinear": ("saxe2014exact",),
    "derive": ("saad1995online", "goldt2019dynamics"),
}
# what every package runs on: JAX, Equinox, Diffrax (solve), Optax (train)
SOFTWARE_KEYS: tuple[str, ...] = ("jax2018github", "kidger2021equinox", "kidger2021on", "deepmind2020jax")
# what an experiment uses beyond its package's paper: the other theories' papers, data sets, metrics
EXPERIMENT_KEYS: dict[str, tuple[str, ...]] = {
    "finite-size": ("sagitova2026specialization", "vashisht2026faster", "chen2026focus"),
    "qkov-hatexplain": ("mathew2021hatexplain", "deyoung2020eraser"),
    "qkov-squad": ("rajpurkar2016squad", "deyoung2020eraser"),
    "qkov-sva": ("warstadt2020blimp", "linzen2016assessing", "deyoung2020eraser"),
    "focus-corpus": ("karpathy2015charrnn", "merity2017pointer"),  # its default corpora
}


def experiment_keys(name: str, package: str) -> list[str]:
    """The keys of experiment ``name`` of ``package``: the package's paper, then `EXPERIMENT_KEYS`,
    then the software, each once."""
    return list(dict.fromkeys([*PACKAGE_KEYS.get(package, ()), *EXPERIMENT_KEYS.get(name, ()), *SOFTWARE_KEYS]))


def keys_for(name: str | None = None) -> list[str]:
    """Citation keys for a theory package (``"qkov"``), a registered experiment
    (``"qkov-reduced"``; `experiment_keys`: its package's paper, the data sets and other papers
    it uses) or, with ``None``, everything: the papers first, then the software. An unknown
    name raises ``ValueError`` listing the valid ones."""
    if name is None:
        papers = [k for keys in (*PACKAGE_KEYS.values(), *EXPERIMENT_KEYS.values()) for k in keys]
        return list(dict.fromkeys(papers)) + list(SOFTWARE_KEYS)
    if not isinstance(name, str):
        raise TypeError(f"name must be a package or experiment name (a string), got {name!r}")
    if name in PACKAGE_KEYS:
        return [*PACKAGE_KEYS[name], *SOFTWARE_KEYS]
    from .registry import load_all

    experiments = load_all()
    if name not in experiments:
        raise ValueError(
            f"unknown package or experiment {name!r}; packages: {', '.join(PACKAGE_KEYS)}; "
            f"experiments: {', '.join(sorted(experiments))}"
        )
    return experiment_keys(name, experiments[name].package)


def reproduce_keys() -> list[str]:
    """The keys of everything ``attnflow reproduce`` runs (the headline experiment of each package,
    `attnflow.registry.headline`): their papers and data sets, then the software, each once."""
    from .registry import headline

    papers = [k for e in headline() for k in experiment_keys(e.name, e.package) if k not in SOFTWARE_KEYS]
    return list(dict.fromkeys(papers)) + list(SOFTWARE_KEYS)


def _known(keys: Iterable[str]) -> list[str]:
    keys = list(keys)
    unknown = [k for k in keys if k not in ENTRIES]
    if unknown:
        raise ValueError(f"unknown citation key(s) {unknown}; known: {', '.join(ENTRIES)}")
    return list(dict.fromkeys(keys))  # each once, in order


def bibtex(keys: Iterable[str]) -> str:
    """The BibTeX entries of ``keys`` (see `ENTRIES`), separated by blank lines."""
    return "\n\n".join(ENTRIES[k][1] for k in _known(keys)) + "\n"


def references(keys: Iterable[str]) -> list[str]:
    """One-line references of ``keys``, for a summary's References section."""
    return [ENTRIES[k][0] for k in _known(keys)]
