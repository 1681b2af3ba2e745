"""The `rl` stage's typed config: what to train from, on which tasks, and which AdaGRPO mechanisms are on.

Hyper-parameters of the optimiser and the mechanisms (learning rate, clip ε, β, tasks a round, n, α, κ, γ, buffer size)
come from the model profile's ``rl:`` section (``configs/models/<profile>.yaml``); ``overrides`` changes them
for one run. Every mechanism is a switch here, so an ablation is an override (``rl.adapr=false``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from mobilerl.config import StageConfig
from mobilerl.env.androidworld import SUITE as ANDROIDWORLD
from mobilerl.env.androidworld import AndroidWorldConfig
from mobilerl.env.cluster import EnvServersConfig, check_server_urls
from mobilerl.models.profiles import RLSettings, load_profile
from mobilerl.rl.judge_monitor import JudgeMonitorConfig
from mobilerl.rl.recipe import RECIPES, Algo, Recipe, resolve


class AsyncConfig(BaseModel):
    """Decoupled rollout and training (``rl.async``; docs/rl.md, "Asynchronous mode")."""

    model_config = ConfigDict(extra="forbid")
    max_staleness: int = Field(..., ge=0, description=(
        "Drop a trajectory whose policy version is more than this many updates behind the trainer's weights."))
    reruns: int = Field(2, ge=0, description=(
        "Times an episode cut short by its env or engine is run again from its start, elsewhere, before it is "
        "dropped and counted (never scored)."))
    engine_wait_s: float = Field(300.0, gt=0, description=(
        "Seconds an episode waits for a live engine with the current weights (rl.engines) before it fails as an "
        "engine failure."))


class _Pool(BaseModel):
    model_config = ConfigDict(extra="forbid")
    count: int = Field(1, ge=1, description="Actors in the pool.")


class RayEngines(_Pool):
    """``rl.ray.engines``: the rollout engines, one actor each."""

    resources: dict[str, float] = Field(default_factory=lambda: {"GPU": 1.0}, description=(
        "Ray resources of one engine (GPU, CPU or custom), reserved in the rollout placement group."))
    engine: Literal["hf", "vllm"] = Field("vllm", description="serve_openai's --engine: vLLM on GPUs, HF on CPUs.")
    device: Literal["cpu", "cuda"] = Field("cuda", description="serve_openai's --device (the HF engine).")
    max_batch: int | None = Field(None, ge=1, description="Requests an engine decodes together (None: its default).")
    args: list[str] = Field(default_factory=list, description="Further serve_openai arguments (e.g. --max-model-len).")


class RayEnvServers(_Pool):
    """``rl.ray.env_servers``: the env servers, one actor each."""

    resources: dict[str, float] = Field(default_factory=lambda: {"avd": 1.0}, description=(
        "Ray resources of one env server: a custom resource (avd) that only the env hosts declare."))
    backend: Literal["sim", "adb"] = Field("sim", description="The env server's backend (adb: the node's AVD).")
    size: int = Field(8, ge=1, description="Env workers of one server (its concurrent episodes).")
    isolate: bool = Field(True, description="Each env in a process of its own inside the server (crash-safe).")


class RayAndroidWorld(_Pool):
    """``rl.ray.androidworld``: AndroidWorld's servers (its ``server/android_server.py``, one emulator each), one
    actor each; ``rl.androidworld`` gives the suite, Ray its ``urls``."""

    resources: dict[str, float] = Field(default_factory=lambda: {"avd": 1.0}, description=(
        "Ray resources of one server: the custom resource (avd) of the hosts with an emulator for it."))
    command: list[str] = Field(..., min_length=1, description=(
        "The server's command line, {host} and {port} filled in per actor (e.g. python -m uvicorn "
        "server.android_server:app --host {host} --port {port})."))
    cwd: str | None = Field(None, description="Directory the command runs in (the android_world checkout; None: Ray's).")
    env: dict[str, str] = Field({}, description="Environment variables the server gets over the node's.")

    @field_validator("command")
    @classmethod
    def _placeholders(cls, v: list[str]) -> list[str]:
        if not any("{port}" in a for a in v):
            raise ValueError("the command must take its port as {port} (Ray picks one per actor)")
        return v


class RayTrainer(BaseModel):
    """``rl.ray.trainer``: the trainer's ranks (rank 0 is the driver)."""

    model_config = ConfigDict(extra="forbid")
    ranks: int = Field(1, ge=1, description="Trainer ranks, the driver included (> 1: rl.trainer_backend ddp/deepspeed).")
    resources: dict[str, float] = Field(default_factory=lambda: {"GPU": 1.0}, description=(
        "Ray resources of one rank actor (ranks 1 … N−1), reserved in the training placement group."))


class RayConfig(BaseModel):
    """``rl.ray``: the Ray cluster and what it runs for ``rl.cluster: ray``."""

    model_config = ConfigDict(extra="forbid")
    address: str = Field("auto", description=(
        "Ray cluster to join: auto (the one `ray start` or `ray job submit` made), a host:port, or local (a "
        "one-node cluster started in this process)."))
    engines: RayEngines | None = Field(None, description="Rollout engines Ray launches (None: local rollout workers).")
    env_servers: RayEnvServers | None = Field(None, description="Env servers Ray launches (None: the in-process simulator).")
    androidworld: RayAndroidWorld | None = Field(None, description=(
        "AndroidWorld servers Ray launches, for rl.suite androidworld (None: rl.androidworld.urls lists them)."))
    trainer: RayTrainer = Field(default_factory=RayTrainer, description="The trainer's ranks.")
    max_restarts: int = Field(3, ge=0, description="Times Ray restarts one engine or env server actor.")
    start_timeout_s: float = Field(600.0, gt=0, description=(
        "Seconds to wait for the placement groups and for every server to answer /health."))
    bind: Literal["node", "loopback"] = Field("node", description=(
        "Servers listen on their node's address (node; reachable from the other nodes) or 127.0.0.1 (one host)."))


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DartConfig(_Section):
    """``rl.dart``: DART's rollout allocation and entropy step selection (docs/rl.md, "Peer options")."""

    min_rollouts: int = Field(2, ge=2, description="Rollouts of a solved task (success rate 1).")
    max_rollouts: int = Field(12, ge=2, description=(
        "Most rollouts a task gets (the round's budget stays tasks × samples_per_task)."))
    success_threshold: float = Field(0.6, ge=0, lt=1, description=(
        "Success rate above which a task's rollouts fall (Figure 5)."))
    window: int = Field(16, ge=1, description="A task's success rate is over its last this many episodes.")
    entropy_keep: float = Field(0.8, gt=0, le=1, description=(
        "Share of each task's steps trained, highest step entropy first (§4.3)."))

    @model_validator(mode="after")
    def _bounds(self) -> DartConfig:
        if self.min_rollouts > self.max_rollouts:
            raise ValueError(f"rl.dart.min_rollouts ({self.min_rollouts}) > rl.dart.max_rollouts ({self.max_rollouts})")
        return self


class DistRLConfig(_Section):
    """``rl.distrl``: DistRL's prioritised replay buffer and Retrace correction."""

    buffer_size: int = Field(256, ge=1, description="Capacity of the circular replay buffer.")
    replay_share: float = Field(0.25, ge=0, description=(
        "Trajectories replayed a round, as a share of the round's configured batch (tasks × n)."))
    w_advantage: float = Field(1.0, ge=0, description="Priority weight w1 of the normalised |A|.")
    w_ratio: float = Field(0.3, ge=0, description="Priority weight w2 of the mean min(1, ρ).")
    w_entropy: float = Field(0.3, ge=0, description="Priority weight w3 of the normalised −log π.")
    alpha: float = Field(0.5, ge=0, description="Prioritisation exponent α of P ∝ p^α.")
    lam: float = Field(1.0, ge=0, le=1, alias="lambda", description="Retrace trace decay λ in c = λ·min(1, ρ).")

    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class BEPAConfig(_Section):
    """``rl.bepa``: BEPA's cache seeding."""

    seed_rollouts: int = Field(4, ge=1, description=(
        "Plan-conditioned episodes that seed a task's cache, once a run, when its group first fails whole."))


class ReverseCurriculumConfig(_Section):
    """``rl.curriculum``: the start-state curriculum from expert prefixes (mobilerl/rl/reverse.py)."""

    start: int = Field(1, ge=1, description="Last steps of a task the policy plays at first (the expert the rest).")
    step: int = Field(1, ge=1, description="Steps more the policy plays once a group from there succeeds enough.")
    grow_at: float = Field(0.5, gt=0, le=1, description="Group success rate at which a task's start moves back.")
    per: Literal["task", "template"] = Field("template", description=(
        "k kept per task, or shared by a template's tasks (drawn far more often than one task)."))


class DynamicSamplingConfig(_Section):
    """``rl.dynamic_sampling``: DAPO's further draws."""

    max_draws: int = Field(4, ge=1, description="Rollout draws of train_batch_size tasks a round at most, the first included.")


class RLConfig(StageConfig):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)  # `async` is a keyword: the field is async_

    profile: str = Field("tiny", description="Model profile whose rl: and generation: sections apply.")
    overrides: dict[str, Any] = Field(default_factory=dict,
                                      description="Keys of the profile's rl: section changed for this run.")
    init: str = Field("data/checkpoints/sft_reasoning_free", description="Checkpoint the policy starts from.")
    reasoning: bool = Field(False, description="Prompt for <think> before the answer (a reasoning-SFT init).")
    out: str = Field("data/checkpoints/adagrpo", description="Where the trained policy is written.")
    work: str = Field(".cache/rl", description="Resumable run folder: checkpoints, rollouts' weights.")
    suite: str = Field("world", description=(
        "Task suite of the training pool (its train split): world or lab (the simulator), androidworld (its servers)."))
    androidworld: AndroidWorldConfig | None = Field(None, description=(
        "AndroidWorld's env servers and suite the episodes run on, for suite androidworld (None: not used)."))
    templates_max_steps: int | None = Field(
        None, ge=1, description="Keep templates whose test tasks need at most this many optimal steps (None: all).")
    tasks_per_template: int | None = Field(None, ge=1, description="Train tasks per template in the pool (None: all).")
    rounds: int = Field(100, ge=1, description="Training rounds (rollout + update each).")
    recipe: Recipe = Field("paper", description=(
        "AdaGRPO's recipe: the paper's text or the authors' released configuration (mobilerl/rl/recipe.py)."))
    algo: Algo = Field(default_factory=lambda: Algo(**RECIPES["paper"]), description=(
        "Switches of the objective and the mechanisms changed from rl.recipe's (the keys not given are the recipe's)."))
    spa: bool = Field(True, description="Shortest-path reward adjustment of successes (§2.2.1).")
    adapr: bool = Field(True, description="Difficulty-adaptive positive replay (§2.2.2).")
    fcf: bool = Field(True, description="Failure curriculum filtering of the task sampling (§2.2.3).")
    curriculum: ReverseCurriculumConfig | None = Field(None, description=(
        "Start a task after the simulator's expert has played all but its last k steps, k growing with success "
        "(None: the policy plays every task whole)."))
    fcf_patience: int = Field(2, ge=1, description="All-zero rounds before a task's cooldown starts.")
    fcf_cooldown: int = Field(3, ge=0, description="Cooldown rounds (weight exp(-f)) before removal.")
    curriculum_init: str | None = Field(None, description="A previous run's curriculum.json to start FCF from.")
    lab_share: float = Field(0.0, ge=0, le=1, description=(
        "Share of a round's tasks drawn from lab/train, whose verifier is hidden (the authors mix 4:1: 0.2)."))
    reward_model: str | None = Field(None, description="Judge checkpoint (the reward_model stage's) scoring lab/train.")
    test_half: Literal[0, 1] | None = Field(None, description=(
        "Train on this half of the suite's test split (mobilerl.tasks.halves) instead of its train split, the "
        "other half left for evaluation (Appendix E.5)."))
    judge_all: bool = Field(False, description=(
        "Reward every episode with rl.reward_model, the verifier's verdict kept only as a metric (E.5's arm ii)."))
    judge_monitor: JudgeMonitorConfig = Field(default_factory=JudgeMonitorConfig, description=(
        "The reward-hacking monitor: judged episodes audited by a verifier training never reads "
        "(mobilerl/rl/judge_monitor.py)."))
    prune_negatives: float | None = Field(
        2.0, ge=0, description="Keep at most this many negatives per positive in a group (None: all).")
    aggregation: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = (
        Field("token-mean", description="How per-token losses are reduced (verl's agg_loss modes)."))
    dart: DartConfig | None = Field(None, description=(
        "DART's data curation (dart.txt §4, mobilerl/rl/dart.py): rollouts per task by success rate, training on "
        "the top high-entropy steps of each task (None: off)."))
    distrl: DistRLConfig | None = Field(None, description=(
        "DistRL's prioritised replay with Retrace correction (distrl.txt §5.2-5.3, mobilerl/rl/distrl.py; None: off)."))
    micro_batch_tokens: int = Field(16384, ge=256, description="Padded tokens per forward in the update.")
    rollout_processes: int = Field(2, ge=1, description="Rollout worker processes (each holds the policy).")
    rollout_concurrency: int = Field(64, ge=1, description="Episodes in flight per rollout worker.")
    env_servers: list[str] | None = Field(None, description=(
        "Env server URLs the episodes run on, token from $MOBILERL_ENV_TOKEN (None: the in-process simulator)."))
    env_pool: EnvServersConfig = Field(default_factory=EnvServersConfig,
                                       description="Health checks, retries and replay over env_servers.")
    engines: list[str] | None = Field(None, description=(
        "API roots of remote rollout engines (serve_openai --weight-sync, HF or vLLM) used instead of the local "
        "rollout workers (None: local workers); docs/rl.md, 'Rollout engines and weight sync'."))
    weight_sync: Literal["reload", "broadcast"] = Field("reload", description=(
        "How each update reaches the engines: a safetensors file they reload (a filesystem shared with rl.work) "
        "or a per-parameter gloo/NCCL broadcast."))
    sync_address: str = Field("127.0.0.1:0", description=(
        "host:port of the trainer's broadcast group, reachable from the engines (port 0: any free port)."))
    engines_api_key_env: str | None = Field(None, description="Environment variable holding the engines' API key.")
    max_batch: int | None = Field(None, ge=1, description="Rows a rollout worker decodes together (None: profile's).")
    cluster: Literal["ray"] | None = Field(None, description=(
        "ray: Ray launches, places and restarts the engines, env servers and trainer ranks of rl.ray (None: the "
        "processes are this one's, or started by hand and listed in rl.engines / rl.env_servers)."))
    ray: RayConfig = Field(default_factory=RayConfig, description="The Ray cluster and its pools, for rl.cluster ray.")
    async_: AsyncConfig | None = Field(None, alias="async", description=(
        "Rollouts run on while the trainer updates, episodes scheduled one at a time (None: synchronous rounds)."))
    bepa: BEPAConfig | None = Field(None, description=(
        "BEPA (bepa.txt §4, mobilerl/rl/bepa.py): a cached success replaces the first rollout of an all-failed group "
        "(None: off)."))
    dynamic_sampling: DynamicSamplingConfig | None = Field(None, description=(
        "DAPO's dynamic sampling (mobilerl/rl/dynamic_sampling.py): draw until the batch's groups all have signal "
        "(None: off)."))
    checkpoint_every: int = Field(5, ge=1, description="Rounds between resumable checkpoints.")
    log_episodes_every: int = Field(10, ge=0, description=(
        "Rounds between MLflow images of a round's best success and a failure of its task, masked (0: none)."))
    state_key: str = Field("~/.config/mobilerl/rl-state.key", description=(
        "Key file sealing the resume state's trajectories and the kept screenshots at rest, kept outside rl.work "
        "(made 0600 when missing)."))
    trainer_backend: Literal["single", "ddp", "deepspeed"] = Field("single", description=(
        "How the update runs: one process, or data-parallel over the processes a launcher started (torchrun, "
        "deepspeed, accelerate launch) with torch.distributed (ddp) or DeepSpeed ZeRO (deepspeed_config)."))
    deepspeed_config: str | None = Field(None, description=(
        "DeepSpeed JSON (repo-relative, e.g. configs/deepspeed/zero2.json) of the deepspeed trainer backend."))
    device: Literal["cpu", "cuda"] = Field("cpu", description="Where the trainer's model and its update run.")
    seed: int = Field(0, description="Seeds task sampling, rollouts and negative pruning.")
    registered_model: str = Field("mobilerl-policy", description="MLflow registered model name.")
    alias: str = Field("adagrpo", description="MLflow alias of the trained policy.")

    @field_validator("env_servers")
    @classmethod
    def _urls(cls, v: list[str] | None) -> list[str] | None:
        return None if v is None else check_server_urls(v)

    @model_validator(mode="after")
    def _judge_for_lab(self) -> RLConfig:
        if self.lab_share > 0 and not self.reward_model:
            raise ValueError("rl.lab_share > 0 needs rl.reward_model: lab/train tasks have no verifier")
        if self.judge_all and not self.reward_model:
            raise ValueError("rl.judge_all needs rl.reward_model: the judge that scores every episode")
        bad = [u for u in self.engines or [] if not u.startswith(("http://", "https://"))]
        if self.engines is not None and (not self.engines or bad):
            raise ValueError(f"rl.engines must be a non-empty list of http(s):// URLs, got {self.engines!r}")
        return self

    @model_validator(mode="before")
    @classmethod
    def _recipe(cls, data: Any) -> Any:
        if isinstance(data, dict):
            algo = data.get("algo")
            data = {**data, "algo": resolve(data.get("recipe", "paper"), algo.model_dump() if isinstance(algo, Algo)
                                            else algo)}
        return data

    @model_validator(mode="after")
    def _androidworld_servers(self) -> RLConfig:
        if (self.suite == ANDROIDWORLD) != (self.androidworld is not None):
            raise ValueError("rl.androidworld (the servers' URLs) is needed by, and only by, rl.suite: androidworld")
        if self.androidworld is None:
            return self
        if self.env_servers:
            raise ValueError("rl.androidworld and rl.env_servers both say where the episodes run: set one")
        if self.lab_share > 0:
            raise ValueError("rl.lab_share > 0 with rl.suite androidworld: lab/train tasks run on the simulator, "
                             "this run's episodes on AndroidWorld's servers")
        by_ray = self.ray.androidworld if self.cluster == "ray" else None
        if not self.androidworld.urls and by_ray is None:
            raise ValueError("rl.androidworld.urls: empty; list AndroidWorld's servers, or have Ray launch them "
                             "(rl.cluster ray, rl.ray.androidworld)")
        n = by_ray.count if by_ray is not None else len(self.androidworld.urls)
        if not self.engines and self.rollout_processes > n:
            raise ValueError(f"rl.rollout_processes ({self.rollout_processes}) > the {n} AndroidWorld server(s) of "
                             "rl.androidworld: each rollout process needs servers of its own")
        try:
            obs_mode = load_profile(self.profile).generation.obs_mode
        except KeyError as e:
            raise ValueError(f"rl.profile: {e.args[0]}") from None
        if obs_mode == "xml":
            raise ValueError(f"rl.profile: {self.profile!r} reads the UI tree only (obs_mode xml), which AndroidWorld's "
                             "server does not serve: rl.suite androidworld needs a screenshot profile")
        return self

    @model_validator(mode="after")
    def _async_peers(self) -> RLConfig:
        # the asynchronous loop takes complete groups from its pump: what needs the round to run episodes is refused
        why = {"dart": "sets each task's rollout count when the round draws its tasks, and the asynchronous pump "
                       "issues groups of samples_per_task",
               "bepa": "seeds its cache with episodes run inside the round, and the asynchronous round runs none",
               "dynamic_sampling": "draws more tasks inside the round, past the admission bound of one round's "
                                   "groups a version",
               "androidworld": "leases AndroidWorld's servers to the synchronous rollout side only"}
        clash = [f"rl.{k} ({reason})" for k, reason in why.items() if getattr(self, k) is not None]
        if self.async_ is not None and clash:
            raise ValueError(f"rl.async is not combined with {'; '.join(clash)}: use synchronous rounds")
        return self

    @model_validator(mode="after")
    def _ray(self) -> RLConfig:
        if self.cluster != "ray":
            return self
        r = self.ray
        for key, pool in (("engines", r.engines), ("env_servers", r.env_servers)):
            if getattr(self, key) is not None and pool is not None:
                raise ValueError(f"rl.{key} and rl.ray.{key} both say where they run: with rl.cluster ray, leave "
                                 f"rl.{key} null (Ray starts them and fills it in)")
        if r.androidworld is not None and (self.androidworld is None or self.androidworld.urls):
            raise ValueError("rl.ray.androidworld launches the servers of rl.androidworld, which gives their suite: "
                             "set rl.suite androidworld and rl.androidworld without urls (Ray fills them in)")
        if (r.trainer.ranks > 1) != (self.trainer_backend != "single"):
            raise ValueError(f"rl.ray.trainer.ranks ({r.trainer.ranks}) > 1 needs, and only it needs, "
                             f"rl.trainer_backend ddp or deepspeed (it is {self.trainer_backend!r})")
        return self

    @model_validator(mode="after")
    def _deepspeed_config(self) -> RLConfig:
        if (self.trainer_backend == "deepspeed") != (self.deepspeed_config is not None):
            raise ValueError("rl.deepspeed_config is needed by, and only by, rl.trainer_backend: deepspeed")
        return self

    def settings(self) -> RLSettings:
        """The profile's rl: section with ``overrides`` applied (errors name ``rl.overrides.<key>``)."""
        base = load_profile(self.profile).rl.model_dump()
        unknown = sorted(set(self.overrides) - set(base))
        if unknown:
            raise ValueError(f"rl.overrides: unknown key(s) {unknown} (known: {sorted(base)})")
        return RLSettings.model_validate({**base, **self.overrides})
