"""`muster simulate`: a training scenario in, the modelled throughput of Muster's placement and of
regular scheduling out, with how much the answer moves with the inputs least known."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from webhook.topology.simulate import Links, Model, Placed, Prediction
    from webhook.topology.stepmodel import GangOnFabric, Step


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sim = sub.add_parser(
        "simulate",
        help="model training throughput: Muster's placement vs regular scheduling",
        description="Places a data-parallel job (workers x GPUs, one rank per GPU) on identical "
        "nodes with Muster and with default spreading + the NVIDIA device plugin, and models "
        "the training throughput of each placement from link speeds, the network, and a "
        "published single-GPU throughput. The defaults are DESIGN's reference scenario; its "
        "published figures are printed beside the prediction, never used as an input. Sources "
        "of every default: docs/topology.md.")
    node = sim.add_mutually_exclusive_group()
    node.add_argument("--node-type", default="dgx1-v100",
                      help="built-in node type (`muster topology list`; default dgx1-v100)")
    node.add_argument("--topology-file", type=Path,
                      help="a node's topology JSON (`muster topology parse` or `show` output)")
    sim.add_argument("--nodes", type=int, default=2, help="identical nodes, all empty (default 2)")
    sim.add_argument("--workers", type=int, default=4, help="worker pods (default 4)")
    sim.add_argument("--gpus-per-worker", type=int, default=1, help="(default 1)")
    sim.add_argument("--model", action="append", metavar="NAME",
                     help="a named model, repeatable: vgg16, resnet50 (default: both)")
    sim.add_argument("--params-millions", type=float,
                     help="your own model: parameters in millions (with --gpu-images-per-second)")
    sim.add_argument("--gpu-images-per-second", type=float,
                     help="your own model: one GPU's training throughput at --batch")
    sim.add_argument("--batch", type=int, default=64,
                     help="per-GPU batch of your own model (default 64)")
    sim.add_argument("--network-gbps", type=float, default=1.25,
                     help="GB/s per direction between two nodes (default 1.25: 10 GbE)")
    sim.add_argument("--efficiency", type=float, default=0.85,
                     help="share of the bottleneck link's bandwidth the allreduce reaches "
                     "(default 0.85)")
    sim.add_argument("--overlap", type=float, default=0.0,
                     help="share of compute time the allreduce hides behind (default 0)")
    sim.add_argument("--placement", type=Path, metavar="FILE",
                     help="model one gang's step time on the placement this YAML/JSON file "
                     "gives (nodes with their types, network labels and the gang's GPUs; the "
                     "fabric's NICs, oversubscription and NVLink cliques): docs/topology.md, "
                     "\"Network model\"; --node-type, --nodes, --workers and --network-gbps "
                     "do not apply")
    sim.add_argument("--json", action="store_true", help="machine-readable output")
    sim.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from webhook.failures import UsageError  # noqa: PLC0415 (keep the CLI light)
    from webhook.topology import simulate  # noqa: PLC0415
    from webhook.topology.builtin import builtin  # noqa: PLC0415
    from webhook.topology.codec import TopologyFormatError, decode  # noqa: PLC0415

    try:
        topology = (decode(args.topology_file.read_text()) if args.topology_file is not None
                    else builtin(args.node_type))
    except KeyError as exc:
        raise UsageError(str(exc.args[0])) from exc
    except TopologyFormatError as exc:
        raise UsageError(f"{args.topology_file}: {exc}") from exc
    models = []
    for name in args.model or ([] if args.params_millions else list(simulate.PRESETS)):
        if name not in simulate.PRESETS:
            raise UsageError(f"unknown model {name!r}: one of {', '.join(simulate.PRESETS)}, "
                             "or --params-millions with --gpu-images-per-second")
        models.append(simulate.PRESETS[name])
    if (args.params_millions is None) != (args.gpu_images_per_second is None):
        raise UsageError("--params-millions and --gpu-images-per-second go together")
    if args.params_millions is not None:
        models.append(simulate.Model("custom", args.params_millions,
                                     args.gpu_images_per_second, args.batch))
    links = simulate.Links(args.network_gbps, args.efficiency, args.overlap)
    if args.placement is not None:
        return _run_placement(args.placement, tuple(models), links, args.json)
    scenario = simulate.Scenario(
        topology=topology, nodes=args.nodes, workers=args.workers,
        gpus_per_worker=args.gpus_per_worker, models=tuple(models),
        links=links)
    try:
        prediction = simulate.predict(scenario)
    except simulate.ScenarioError as exc:
        raise UsageError(str(exc)) from exc
    print(json.dumps(as_json(prediction), indent=2) if args.json
          else simulate.format_prediction(prediction))
    return 0


def _run_placement(path: Path, models: tuple[Model, ...], links: Links, as_json_out: bool) -> int:
    from webhook.failures import UsageError  # noqa: PLC0415
    from webhook.topology import stepmodel  # noqa: PLC0415
    from webhook.yamlpos import YamlProblem, load_all, read  # noqa: PLC0415

    if not 0 < links.efficiency <= 1 or not 0 <= links.overlap <= 1:
        raise UsageError("efficiency must be in (0, 1], overlap in [0, 1]")
    try:
        docs = load_all(read(path))
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror or exc}") from exc
    except YamlProblem as exc:
        raise UsageError(f"not YAML or JSON: {exc.at(str(path))}") from exc
    doc = docs[0] if len(docs) == 1 else None
    try:
        gang = stepmodel.parse_placement(doc)
    except stepmodel.PlacementError as exc:
        raise UsageError(f"{path}: {exc}") from exc
    step = stepmodel.model_step(gang, models, links)
    if as_json_out:
        print(json.dumps(step_json(gang, step), indent=2))
        return 0
    net = "none (one node)" if step.network_gbps == float("inf") else f"{step.network_gbps:g} GB/s"
    lines = [f"Gang: {step.gpus} GPUs on {len(gang.gpus)} node(s), "
             f"{step.tiers_crossed} switch tier(s) above the leaf crossed",
             f"  between nodes: {net}",
             f"  allreduce bus bandwidth: {step.bus_gbps:g} GB/s (bottleneck: {step.bottleneck})",
             f"  efficiency {links.efficiency:g}, overlap {links.overlap:g}",
             "Modelled step time:"]
    for m in models:
        s = step.step_seconds[m.name]
        lines.append(f"  {m.name:<9} {s * 1e3:10.2f} ms   {step.gpus * m.batch / s:10.1f} img/s")
    print("\n".join(lines))
    return 0


def step_json(gang: GangOnFabric, step: Step) -> dict[str, Any]:
    """A placement's modelled figures as JSON."""
    return {"gpus": step.gpus, "nodes": {n: list(g) for n, g in gang.gpus.items()},
            "tiersCrossed": step.tiers_crossed, "busGBps": step.bus_gbps,
            "networkGBps": None if step.network_gbps == float("inf") else step.network_gbps,
            "bottleneck": step.bottleneck,
            "modelledStepSeconds": dict(step.step_seconds)}


def as_json(r: Prediction) -> dict[str, Any]:
    """The prediction as JSON (every throughput is modelled; `checks` hold published figures)."""
    s = r.scenario

    def placed(p: Placed) -> dict[str, Any]:
        return {"gpus": {n: list(g) for n, g in p.gpus.items()},
                "bottleneckGBps": p.bottleneck_gbps, "overNetwork": p.over_network,
                "modelledImagesPerSecond": dict(p.images_per_s)}

    return {
        "scenario": {"node": s.topology.name, "nodes": s.nodes, "workers": s.workers,
                     "gpusPerWorker": s.gpus_per_worker,
                     "models": [{"name": m.name, "paramsMillions": m.params_millions,
                                 "gpuImagesPerSecond": m.gpu_images_per_s, "batch": m.batch}
                                for m in s.models],
                     "networkGBps": s.links.network_gbps, "efficiency": s.links.efficiency,
                     "overlap": s.links.overlap},
        "muster": placed(r.muster),
        "regular": placed(r.regular),
        "inNode": [{"gpus": list(c.gpus), "allreduceGBps": c.allreduce_gbps,
                    "modelledImagesPerSecond": dict(c.images_per_s)} for c in r.in_node],
        "sensitivity": [{"input": v.name, "low": v.low, "high": v.high,
                         "modelledImagesPerSecond": {
                             n: {"low": {"muster": lo[0], "regular": lo[1]},
                                 "high": {"muster": hi[0], "regular": hi[1]}}
                             for n, (lo, hi) in v.images_per_s.items()}}
                        for v in r.sensitivity],
        "checks": [{"model": c.model, "placement": c.placement, "modelled": c.predicted,
                    "published": c.published, "errorPercent": c.error_pct} for c in r.checks],
    }
