"""The explorer fits a 1280 x 800 screen: no column of the list is cut off or pushed out of view,
with the detail panel closed or open, for a plain history and for a page that shows every column
the list has (variants, multi-device runs, Hub facts, long ids); sweeps read as name and date
with the id on hover, no row wraps, and a cell too narrow for its text carries the whole text as
its tooltip. Whose failure it is reads whole in the list ("unknown" included), and the detail
panel's history cuts no cell: it is read there."""

from __future__ import annotations

import pytest

from fixtures.synthetic import write_synthetic_history
from helpers import offline_page
from model_support.record import schema, store
from model_support.record.sweep_meta import ModelEntry, SweepMeta
from model_support.render import explorer

SCREEN = {"width": 1280, "height": 800}
#: What the page measures: overflow of the list, the visible headers (text, width, cut, out of
#: view), the cells whose text is cut without the whole of it as their tooltip, and the distinct row
#: heights.
MEASURE = """() => {
  const list = document.querySelector('#list'), box = list.getBoundingClientRect();
  const shown = (el) => el.offsetParent !== null;
  const heads = [...document.querySelectorAll('#results thead th')].filter(shown).map((th) => {
    const r = th.getBoundingClientRect();
    return [th.textContent, Math.round(r.width), th.scrollWidth > th.clientWidth, r.left < box.left - 1 || r.right > box.right + 1];
  });
  const cells = [...document.querySelectorAll('#results tbody td')].filter(shown);
  const cut = cells.filter((td) => td.scrollWidth > td.clientWidth);
  return {
    overflow: list.scrollWidth - list.clientWidth,
    heads,
    untitled: cut.filter((td) => !td.title || (!td.matches('.sweep, .stack, .whose') && td.title !== td.textContent))
      .map((td) => td.className + ': ' + td.textContent),
    whose_cut: cut.filter((td) => td.matches('.whose')).map((td) => td.textContent),
    panel_cut: [...document.querySelectorAll('#detail table.history td')].filter(shown)
      .filter((td) => td.scrollWidth > td.clientWidth).map((td) => td.className + ': ' + td.textContent),
    verdicts_cut: cut.filter((td) => td.matches('.st')).map((td) => td.textContent),
    heights: [...new Set([...document.querySelectorAll('#results tbody tr')].map((tr) => Math.round(tr.getBoundingClientRect().height)))],
    sweeps: [...document.querySelectorAll('#results tbody td.sweep')].slice(0, 3).map((td) => [td.textContent, td.title]),
  };
}"""


def every_column(data) -> list[str]:
    """Two sweeps of long-named models in two variants, on two devices (tensor parallel), with
    Hub facts and long failure signatures: the list shows each of its columns."""
    ids = []
    for day in (1, 2):
        sweep_id = f"tpu-weekly-with-a-long-name-202612{day:02d}T020000Z-{day:04x}"
        models = [
            f"an-organisation-with-a-long-name/model-{i}-with-an-even-longer-name-Instruct"
            for i in range(12)
        ]
        SweepMeta(
            sweep_id=sweep_id,
            name="tpu-weekly-with-a-long-name",
            created_at=f"2026-12-{day:02d}T02:00:00+00:00",
            probe={"device": "tpu"},
            models=[ModelEntry(m) for m in models],
        ).write(store.sweep_dir(data, sweep_id))
        for i, model_id in enumerate(models):
            for variant, mode, cache in (
                ("eager+dynamic", "eager", "dynamic"),
                ("compile+static", "compile", "static"),
            ):
                failed = (i + day) % 3 == 0
                record = schema.empty_record(
                    sweep_id=sweep_id,
                    model_id=model_id,
                    variant=variant,
                    mode=mode,
                    cache=cache,
                    status=schema.FAIL_OTHER if failed else schema.PASS,
                    failure_stage="generate" if failed else None,
                    failure_signature="RuntimeError: a long failure message <n> about <name> that goes on @ "
                    "modeling.forward"
                    if failed
                    else None,
                    attribution="unknown" if failed else None,
                    devices_used=2,
                    parallelism="tp",
                    device_type="tpu",
                    model_type="a_long_model_type_name",
                    versions={
                        "torch": "2.13.0+cpu",
                        "torch_tpu": "0.2.0.dev20261201",
                        "transformers": "5.0.0.dev0",
                    },
                    pipeline_tag="text-generation",
                    downloads=1_234_567 * (i + 1),
                    trending_score=i,
                )
                store.store_result(data, sweep_id, record, None, "log\n")
        store.compact(data, sweep_id)
        ids.append(sweep_id)
    return ids


def check_fits(page, label: str) -> dict:
    measured = page.evaluate(MEASURE)
    heads = {h[0]: h for h in measured["heads"]}
    assert measured["overflow"] <= 0, (
        f"{label}: the list scrolls sideways by {measured['overflow']} px"
    )
    assert [h[0] for h in measured["heads"] if h[2] or h[3]] == [], (
        f"{label}: headers cut or out of view {heads}"
    )
    assert all(h[1] >= 30 for h in measured["heads"]), (
        f"{label}: a column narrower than 30 px {heads}"
    )
    assert measured["untitled"] == [] and measured["verdicts_cut"] == [], label
    assert measured["whose_cut"] == [] and measured["panel_cut"] == [], (label, measured)
    assert len(measured["heights"]) == 1, (
        f"{label}: rows of several heights (a cell wraps) {measured['heights']}"
    )
    return measured


@pytest.mark.browser
@pytest.mark.parametrize("kind", ["history", "every-column"])
def test_the_list_fits_1280_pixels(browser, tmp_path, kind):
    if kind == "history":
        ids = write_synthetic_history(tmp_path, 4, 300, seed=1)
        label = "tpu-nightly 2026-01-08"
    else:
        ids = every_column(tmp_path)
        label = "tpu-weekly-with-a-long-name 2026-12-02"
    page, attempted, errors = offline_page(browser)
    page.set_viewport_size(SCREEN)
    page.goto(explorer.build_explorer(tmp_path).as_uri())
    page.wait_for_selector("#results tbody tr")
    closed = check_fits(page, f"{kind}, panel closed")
    assert closed["sweeps"][0] == [label, ids[-1]]  # name and date; the full id on hover
    if kind == "every-column":
        shown = [h[0] for h in closed["heads"]]
        assert shown == [
            "model",
            "variant",
            "type",
            "verdict",
            "whose",
            "check",
            "devices",
            "signature",
            "sweep",
            "device",
            "stack",
            "runs",
            "task",
            "downloads",
        ]
    page.locator("#results tbody tr").first.click()
    page.locator("#detail").wait_for(state="visible")
    check_fits(page, f"{kind}, panel open")
    history = page.locator("#detail table.history tbody td.sweep").first
    assert history.get_attribute("title") == ids[-1] and history.inner_text() == label
    assert attempted == [] and errors == []
    page.close()


def test_sweep_labels_are_name_and_date_unless_two_would_read_the_same():
    ids = [
        "smoke-20261201T020000Z-aaaa",
        "smoke-20261202T020000Z-bbbb",
        "smoke-20261202T090000Z-cccc",
        "nightly-20261202T090000Z-dddd",
        "nightly-20261202T090000Z-eeee",
        "no-time-in-this-id",
    ]
    assert explorer.sweep_labels(ids) == [
        "smoke 2026-12-01",
        "smoke 2026-12-02 02:00",
        "smoke 2026-12-02 09:00",
        "nightly 2026-12-02 09:00:00 dddd",
        "nightly 2026-12-02 09:00:00 eeee",
        "no-time-in-this-id",
    ]
