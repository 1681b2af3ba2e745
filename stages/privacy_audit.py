"""Stage `privacy_audit`: scan everything the collection stored for personal data; fail if any is left.

Every store under ``data/collect/stores`` is scanned (:mod:`mobilerl.data.audit`): all text fields, the
XML, the store's JSON, and the OCR'd text of stored screenshots (all, or a deterministic sample of
``ocr_max_images`` per store), with the detector (surrogates the collector registered are not findings)
and for the exact raw values the simulator planted. Those canaries are re-derived in memory from the
stored task ids by rebuilding each task's device — nothing about them is ever written to disk.

Outs: ``data/privacy/report.json`` (findings without raw values: category, rule, place, fingerprint,
context with the value replaced by its token); metrics: ``data/privacy/metrics.json``. The stage exits
non-zero when anything is found, and `sft_data` refuses data whose audit did not pass.
"""

from __future__ import annotations

from pydantic import Field

from mobilerl import tracking
from mobilerl.config import ROOT, StageConfig, load_params, write_json

STORES = ROOT / "data" / "collect" / "stores"
OUT = ROOT / "data" / "privacy"


class PrivacyAuditConfig(StageConfig):
    ocr: bool = Field(True, description="OCR stored screenshots and scan their text too.")
    ocr_max_images: int | None = Field(150, ge=1, description="Screenshots OCR'd per store (null: every one).")
    ocr_workers: int = Field(2, ge=1, description="Parallel tesseract processes.")
    ocr_scale: float = Field(1.0, gt=0, description="Image scale for OCR.")
    seed: int = Field(0, description="Seed of the OCR sample.")


def run(cfg: PrivacyAuditConfig) -> tuple[dict, object]:
    from mobilerl.data.audit import audit, find_stores, write_report

    stores = find_stores(STORES)
    if not stores:
        raise SystemExit(f"privacy_audit: no trajectory store under {STORES}: run the `collect` stage first")
    report = audit(stores, ocr=cfg.ocr, ocr_max_images=cfg.ocr_max_images, ocr_workers=cfg.ocr_workers,
                   ocr_scale=cfg.ocr_scale, seed=cfg.seed, progress=True)
    write_report(report, OUT / "report.json")
    return report.summary(), report


def main() -> None:
    cfg = load_params("privacy_audit", PrivacyAuditConfig)
    with tracking.stage_run("privacy_audit", cfg.model_dump()) as run_:
        metrics, report = run(cfg)
        flat = {"passed": int(metrics["passed"]), "findings": metrics["findings"],
                **{f"stores/{k}": v for k, v in metrics["stores"].items()},
                **{f"by_category/{k}": v for k, v in metrics["findings_by_category"].items()}}
        tracking.log_metrics({"privacy_audit": flat})
        metrics["mlflow_run_id"] = run_.info.run_id
    write_json(OUT / "metrics.json", metrics)
    for name, st in metrics["stores"].items():
        print(f"privacy_audit: {name}: {st.get('episodes', 0)} episodes, {st.get('texts', 0)} texts, "
              f"{st.get('images_ocr', 0)}/{st.get('images', 0)} images OCR'd, {st.get('canaries', 0)} canaries "
              f"checked, {st.get('findings', 0)} findings")
    if not metrics["passed"]:
        raise SystemExit(f"privacy_audit: {metrics['findings']} findings ({metrics['findings_by_category']}); "
                         f"see {OUT / 'report.json'}")


if __name__ == "__main__":
    main()
