# Copyright 2026 The MaxText NVFP4 plugin authors. Licensed under the Apache License, Version 2.0 (see LICENSE).
"""The one seam to maxtext: every maxtext (and jax) symbol the plugin wraps, what it expects of it, who installs it.

maxtext's code is never edited or copied. The plugin replaces a few module and class attributes of maxtext, all
looked up by maxtext at call time, which is why wrapping them works. `HOOKS` below is the whole contact surface;
docs/backends.md's "How it hooks into maxtext" is this table (a test keeps the two equal). `register()` first checks every
entry against the installed maxtext (the symbol exists, and its signature still has the parameters the wrapper
binds by name), and only then installs the `register` entries together. A maxtext whose signatures changed
therefore fails at `register()` in one error naming each symbol and what differs, instead of inside a traced train
step, or silently. jax is never patched for the process: `jax.lax.ragged_dot` is routed only while one NVFP4
RoutedMoE call is traced (MaxText.integration.moe), and is jax's own before and after.

This module imports only the standard library, so `import MaxText` stays cheap: maxtext (and with it jax) is
imported by `register()`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.metadata
import inspect
import threading
from collections.abc import Callable, Iterator
from typing import Any, Literal

__all__ = ["HOOKS", "Hook", "IncompatibleMaxText", "SUPPORTED_MAXTEXT", "check", "install_cli_error_handler",
           "installed_during", "is_registered", "register", "resolve"]

#: maxtext releases this plugin is tested against (pyproject's requirement; CI trains a tiny run on each).
SUPPORTED_MAXTEXT = ("0.2.4", "0.2.5")

#: Marks our wrappers, so a second `register()` never wraps a wrapper.
_MARK = "_nvfp4_plugin_wrapper"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Hook:
  """One symbol the plugin wraps.

  targets: "module:attribute" or "module:Class.attribute", one or more symbols that take the same wrapper.
  params: parameter names the wrapper binds by name (they must be in the symbol's signature).
  wrapper: "module:function" that takes the original and returns the replacement.
  when: "register" (installed by register()), "cli" (by the `MaxText.train` command line only), "moe call" (only
    while an NVFP4 RoutedMoE call is traced).
  why: what the plugin does there.
  """

  targets: tuple[str, ...]
  params: tuple[str, ...]
  wrapper: str
  when: Literal["register", "cli", "moe call"]
  why: str


_TRAINER = "maxtext.trainers.pre_train.train"
HOOKS: tuple[Hook, ...] = (
    Hook(targets=("maxtext.configs.pyconfig:initialize", "maxtext.configs.pyconfig:initialize_pydantic"),
         params=("argv", "config_class"), wrapper="MaxText.integration.hooks:wrap_initialize", when="register",
         why="loads configs with the nvfp4_* keys (NVFP4Config; a caller's own config class gets them too)"),
    Hook(targets=("maxtext.layers.quantizations:configure_quantization",), params=("config", "quant_mode_str"),
         wrapper="MaxText.integration.hooks:wrap_configure_quantization", when="register",
         why="te_nvfp4 / te_nvfp4_no_rht get the plugin's quant object; every other mode goes to maxtext"),
    Hook(targets=("maxtext.layers.quantizations:maybe_quantize_model",), params=("model", "config"),
         wrapper="MaxText.integration.hooks:wrap_maybe_quantize_model", when="register",
         why="after a model is built: each NVFP4 GEMM's decoder layer index; in training runs, the precision plan"),
    Hook(targets=(f"{_TRAINER}:train_loop",), params=("config",),
         wrapper="MaxText.integration.hooks:wrap_train_loop", when="register",
         why="a training run: the resume record (NVFP4 runs and resumes of one) and the plan"),
    Hook(targets=(f"{_TRAINER}:train_step", f"{_TRAINER}:eval_step"), params=("config", "state"),
         wrapper="MaxText.integration.steps:wrap_step", when="register",
         why="the state's optimizer step is current while a train or eval step is traced (the late BF16 switches,"
         " statistics steps); a train step's metrics get the GEMMs' nvfp4/ statistics"),
    Hook(targets=("maxtext.common.metric_logger:MetricLogger.write_metrics",), params=("self", "metrics", "step"),
         wrapper="MaxText.integration.telemetry:filter_written_metrics", when="register",
         why="nvfp4/ statistics are written (TensorBoard, metrics_file, ...) for statistics steps only"),
    Hook(targets=(f"{_TRAINER}:training_loop_iteration",), params=("python_vars", "immutable_data"),
         wrapper="MaxText.integration.steps:wrap_iteration", when="register",
         why="logs (host side) the step at which a late switch takes effect"),
    Hook(targets=("maxtext.common.checkpointing:load_params_from_path",),
         params=("load_parameters_from_path", "abstract_unboxed_params"),
         wrapper="MaxText.integration.checkpoints:wrap_load_params_from_path", when="register",
         why="load_parameters_path: the checkpoint's weights load into an NVFP4 model; the plugin's own variables"
         " (SR counters, layer indices, taps, expert state) start fresh, named in one line"),
    Hook(targets=("maxtext.layers.moe:RoutedMoE.__init__",), params=("quant", "rngs"),
         wrapper="MaxText.integration.moe:wrap_routed_moe_init", when="register",
         why="NVFP4 experts: the layer's stochastic-rounding key and BF16 switch state"),
    Hook(targets=("maxtext.layers.moe:RoutedMoE.__call__",), params=("inputs",),
         wrapper="MaxText.integration.moe:wrap_routed_moe_call", when="register",
         why="NVFP4 experts: the layer's expert GEMMs run NVFP4 while the call is traced"),
    Hook(targets=("maxtext.kernels.megablox:gmm",),
         params=("lhs", "rhs", "group_sizes", "preferred_element_type", "existing_out", "transpose_rhs",
                 "partial_sum"),
         wrapper="MaxText.integration.moe:wrap_gmm", when="register",
         why="megablox=true: the grouped expert GEMM in NVFP4 during an NVFP4 RoutedMoE call"),
    Hook(targets=("jax.lax:ragged_dot",),
         params=("lhs", "rhs", "group_sizes", "preferred_element_type", "group_offset"),
         wrapper="MaxText.integration.moe:wrap_ragged_dot", when="moe call",
         why="megablox=false: routed to the NVFP4 grouped GEMM only while an NVFP4 RoutedMoE call is traced"),
    Hook(targets=("maxtext.configs.pyconfig:_handle_config_exception",), params=("e",),
         wrapper="MaxText.integration.cli:one_line_config_errors", when="cli",
         why="`python -m MaxText.train` only: a config error is one line on stderr and exit 2"),
)


class IncompatibleMaxText(RuntimeError):
  """The installed maxtext lacks a symbol the plugin wraps, or its signature changed."""


def resolve(target: str) -> tuple[Any, str, Any]:
  """(owner object, attribute name, current value) of "module:attr" or "module:Class.attr"."""
  module_name, _, path = target.partition(":")
  owner: Any = importlib.import_module(module_name)
  *parents, name = path.split(".")
  for parent in parents:
    owner = getattr(owner, parent)
  return owner, name, getattr(owner, name)


def _maxtext_version() -> str:
  try:
    return importlib.metadata.version("maxtext")
  except importlib.metadata.PackageNotFoundError:
    return "not installed"


def _problem(target: str, params: tuple[str, ...]) -> str | None:
  """What is wrong with one hooked symbol in the installed maxtext/jax, or None."""
  try:
    _, _, value = resolve(target)
  except (ImportError, AttributeError) as e:
    return f"{target} is missing ({type(e).__name__}: {e})"
  try:
    parameters = inspect.signature(value).parameters
  except (TypeError, ValueError) as e:
    return f"{target} has no readable signature ({e})"
  missing = [p for p in params if p not in parameters]
  if missing:
    return (f"{target} has parameters ({', '.join(parameters)}); the plugin binds "
            f"{', '.join(repr(p) for p in missing)} by name")
  return None


def check() -> None:
  """Checks every hook against the installed maxtext and jax.

  Raises:
    IncompatibleMaxText: naming each symbol that is missing or whose signature lacks a parameter, the installed
      maxtext version and the supported ones.
  """
  problems = [p for hook in HOOKS for target in hook.targets if (p := _problem(target, hook.params))]
  if problems:
    raise IncompatibleMaxText(
        f"the NVFP4 plugin cannot hook into maxtext {_maxtext_version()}: {'; '.join(problems)}. Supported maxtext "
        f"versions: {', '.join(SUPPORTED_MAXTEXT)}.")


def _install(hook: Hook, make_wrapper: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None) -> None:
  """Replaces each of the hook's symbols with its wrapper of the original, unless it already is one of ours."""
  if make_wrapper is None:
    module_name, _, function = hook.wrapper.partition(":")
    make_wrapper = getattr(importlib.import_module(module_name), function)
  for target in hook.targets:
    owner, name, original = resolve(target)
    if not getattr(original, _MARK, False):
      wrapper = make_wrapper(original)
      setattr(wrapper, _MARK, True)
      setattr(owner, name, wrapper)


_LOCK = threading.Lock()
_registered = False


def register() -> None:
  """Installs the plugin into maxtext; safe to call any number of times, from any thread.

  Must run before maxtext loads a config or builds a model (the `MaxText.train` entry point does it first).

  Raises:
    IncompatibleMaxText: see `check`; nothing is installed then.
  """
  global _registered  # pylint: disable=global-statement
  with _LOCK:
    if _registered:
      return
    check()
    for hook in HOOKS:
      if hook.when == "register":
        _install(hook)
    _registered = True


_DURING_LOCK = threading.Lock()
_during_users: dict[str, int] = {}
_during_originals: dict[str, Any] = {}


@contextlib.contextmanager
def installed_during(when: Literal["moe call"]) -> Iterator[None]:
  """The `when` entries of HOOKS installed for the duration of the block, then the originals put back.

  Counted, so blocks entered at once in several threads share one installation and the last to leave restores the
  originals (the "moe call" wrapper itself hands calls outside an NVFP4 RoutedMoE call to the original). `check()`
  has checked these entries at `register()`, before the block can be entered.
  """
  hooks = [h for h in HOOKS if h.when == when]
  with _DURING_LOCK:
    if not _during_users.get(when):
      for hook in hooks:
        for target in hook.targets:
          _during_originals[target] = resolve(target)[2]
        _install(hook)
    _during_users[when] = _during_users.get(when, 0) + 1
  try:
    yield
  finally:
    with _DURING_LOCK:
      _during_users[when] -= 1
      if not _during_users[when]:
        for hook in hooks:
          for target in hook.targets:
            owner, name, _ = resolve(target)
            setattr(owner, name, _during_originals.pop(target))


def install_cli_error_handler(handler: Callable[[Exception], None]) -> None:
  """Our command line only: maxtext's config-error handler replaced by `handler` (see `HOOKS`)."""
  (hook,) = [h for h in HOOKS if h.when == "cli"]
  _install(hook, lambda original: handler)


@contextlib.contextmanager
def config_errors_raised() -> Iterator[None]:
  """Inside the block maxtext's config errors raise (maxtext's own exception) instead of reaching the config-error
  handler, maxtext's or our command line's, both of which exit: for a caller that tries many configs and reports a
  refused one as a row (the pre-flight's --tune). The handler in place before is back after the block."""
  (hook,) = [h for h in HOOKS if h.when == "cli"]
  saved = [resolve(target) for target in hook.targets]

  def _handle_config_exception(e: Exception) -> None:
    raise e

  for owner, name, _ in saved:
    setattr(owner, name, _handle_config_exception)
  try:
    yield
  finally:
    for owner, name, original in saved:
      setattr(owner, name, original)


def is_registered() -> bool:
  """True once `register()` has installed the plugin in this process."""
  return _registered
