"""Calculators a reader can move: HTML sliders with a few lines of JavaScript, no CDN, no kernel.

They work in JupyterLab and in the static reading copy alike (plain <input type=range> and a
script that recomputes on every move), start at this run's measured values, and compute the
same formulas the package uses, written out beside them:

* `e2e_mfu_calculator(local_mfu, imbalance, exposed_share)`: E2E MFU = local MFU x scaling
  ratio, with scaling ratio = (1 - exposed share of the step) / imbalance (max / mean rank
  compute; gemref/mfu/meter.py defines the two factors).
* `memory_calculator(params, table_params)`: bytes per rank of parameters, gradients and AdamW
  state (fp32: 4 + 4 + 8 bytes per parameter) under DDP (everything on every rank), FSDP over
  N ranks (1/N of everything) and HSDP on an R x S mesh (1/S), with the embedding tables
  row-sharded over S or replicated (gemref/parallel/memory.py counts the same on real ranks).
"""
from __future__ import annotations

import html
import itertools

_ids = itertools.count()


def _slider(uid: str, name: str, label: str, low: float, high: float, step: float, value: float) -> str:
    return (f"<label style='display:block;margin:2px 0'>{html.escape(label)}: "
            f"<input type='range' id='{uid}-{name}' min='{low}' max='{high}' step='{step}' value='{value}' "
            f"style='vertical-align:middle;width:260px'> <span id='{uid}-{name}-v'></span></label>")


def _page(uid: str, title: str, sliders: list[str], formula: str, script: str) -> dict:
    body = (f"<div id='{uid}' class='gemref-calculator' style='border:1px solid #ccc;padding:8px;margin:6px 0;"
            f"font-family:sans-serif'><b>{html.escape(title)}</b>{''.join(sliders)}"
            f"<div id='{uid}-out' style='margin-top:6px'></div>"
            f"<div style='color:#666;font-size:90%'>{html.escape(formula)}</div></div>"
            f"<script>(function(){{{script}}})();</script>")
    return {"text/html": body, "text/plain": f"[calculator: {title}] {formula}"}


def e2e_mfu_calculator(local_mfu: float, imbalance: float, exposed_share: float) -> dict:
    """A display bundle (module doc); values are fractions (0.25 = 25%)."""
    uid = f"gemref-e2e-{next(_ids)}"
    sliders = [_slider(uid, "local", "local MFU (%)", 1, 80, 0.5, round(100 * local_mfu, 1)),
               _slider(uid, "imb", "imbalance (max / mean rank compute)", 1.0, 2.5, 0.01, round(imbalance, 2)),
               _slider(uid, "exp", "exposed communication (% of the step)", 0, 60, 0.5, round(100 * exposed_share, 1))]
    script = f"""
var q = function(n) {{ return document.getElementById('{uid}-' + n); }};
function update() {{
  var local = +q('local').value / 100, imb = +q('imb').value, exp = +q('exp').value / 100;
  q('local-v').textContent = (100 * local).toFixed(1) + '%';
  q('imb-v').textContent = imb.toFixed(2);
  q('exp-v').textContent = (100 * exp).toFixed(1) + '%';
  var scaling = (1 - exp) / imb;
  q('out').innerHTML = 'scaling ratio <b>' + scaling.toFixed(3) + '</b>, E2E MFU <b>' +
      (100 * local * scaling).toFixed(2) + '%</b>';
}}
['local', 'imb', 'exp'].forEach(function(n) {{ q(n).addEventListener('input', update); }});
update();"""
    return _page(uid, "E2E MFU from its factors (starts at this run's values)", sliders,
                 "E2E MFU = local MFU x scaling ratio; scaling ratio = (1 - exposed share) / imbalance", script)


def memory_calculator(params: int, table_params: int, ranks: int = 8, shard: int = 8) -> dict:
    """A display bundle (module doc): `params` of the whole model, `table_params` of them in embedding tables."""
    uid = f"gemref-mem-{next(_ids)}"
    sliders = [_slider(uid, "p", "model parameters (millions)", 0.1, 20000, 0.1, round(params / 1e6, 1)),
               _slider(uid, "t", "of which embedding tables (%)", 0, 99.9, 0.1,
                       round(100 * table_params / max(params, 1), 1)),
               _slider(uid, "n", "ranks N", 1, 4096, 1, ranks),
               _slider(uid, "s", "shard group S (HSDP: N / S replica groups)", 1, 512, 1, shard)]
    script = f"""
var q = function(n) {{ return document.getElementById('{uid}-' + n); }};
function gib(x) {{ return (x / 1073741824).toFixed(3) + ' GiB'; }}
function update() {{
  var P = +q('p').value * 1e6, t = +q('t').value / 100, N = +q('n').value, S = Math.min(+q('s').value, N);
  q('p-v').textContent = (P / 1e6).toFixed(1) + ' M'; q('t-v').textContent = (100 * t).toFixed(1) + '%';
  q('n-v').textContent = N; q('s-v').textContent = S;
  var per = 16;   // fp32 parameter + gradient + AdamW's two moments, bytes per parameter
  var rows = [['DDP (replicated)', per * P], ['FSDP 1x' + N, per * P / N],
              ['HSDP ' + Math.floor(N / S) + 'x' + S + ', tables row-sharded over S', per * P / S],
              ['HSDP, tables replicated', per * (P * (1 - t) / S + P * t)]];
  var top = rows[0][1];
  q('out').innerHTML = rows.map(function(r) {{
    return '<div>' + r[0] + ': <b>' + gib(r[1]) + '</b> per rank <span style="display:inline-block;height:8px;' +
        'background:#4C78A8;width:' + Math.max(1, 300 * r[1] / top) + 'px"></span></div>'; }}).join('');
}}
['p', 't', 'n', 's'].forEach(function(n) {{ q(n).addEventListener('input', update); }});
update();"""
    return _page(uid, "memory per rank: parameters, gradients and AdamW state (starts at this model)", sliders,
                 "bytes per rank = 16 bytes x parameters held; DDP holds all, FSDP 1/N, HSDP 1/S "
                 "(activations are extra, and grow with the per-rank batch)", script)
