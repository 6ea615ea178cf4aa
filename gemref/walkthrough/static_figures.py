"""Figures every viewer can show: interactive in JupyterLab, drawn in static HTML, PNG without scripts.

JupyterLab draws `application/vnd.plotly.v1+json` (interactive), but a static viewer
(nbconvert HTML, the reading copy of `gemref notebooks build`) ignores it. After
`use_static_figures()` (which `Chapter` calls), every `fig.show()` also carries
`text/html` that draws with the plotly.js embedded once per notebook (offline, no CDN:
plotly's Python package ships plotly.min.js) and, where a Chromium is installed for kaleido,
an `image/png` fallback for viewers that run no scripts.
"""
from __future__ import annotations

import atexit
import base64

PNG_SIZE = (900, 500)          # pixels of the static fallback (width, height)


def _html_renderer():
    """text/html drawing with window.Plotly (embedded once by `use_static_figures`), no MathJax."""
    from plotly.io import to_html
    from plotly.io._base_renderers import MimetypeRenderer

    class OfflineHtml(MimetypeRenderer):
        def to_mimebundle(self, fig_dict):
            return {"text/html": to_html(fig_dict, include_plotlyjs=False, include_mathjax=False,
                                         full_html=False, default_width="100%", default_height=450,
                                         validate=False)}
    return OfflineHtml()


# kaleido 1.x can run an export in a page context its script has not defined yet (seen once
# under load: JavascriptError "kaleido_scopes is not defined"); a fresh server loads it again
_UNLOADED_PAGE = "kaleido_scopes is not defined"


def _png_renderer():
    """image/png through kaleido on one Chromium kept open for the kernel's life; an export
    that finds kaleido's page script unloaded restarts the server and runs once more."""
    import kaleido
    from plotly.io._base_renderers import MimetypeRenderer

    class KaleidoPng(MimetypeRenderer):
        started = False

        def _start(self):
            kaleido.start_sync_server(mathjax=False, silence_warnings=True)
            if not self.started:                     # one stop at exit, however often it restarts
                atexit.register(kaleido.stop_sync_server, silence_warnings=True)
            self.started = True

        def to_mimebundle(self, fig_dict):
            opts = dict(format="png", width=PNG_SIZE[0], height=PNG_SIZE[1])
            if not self.started:
                self._start()
            try:
                png = kaleido.calc_fig_sync(fig_dict, opts=opts)
            except RuntimeError as e:
                if _UNLOADED_PAGE not in str(e):
                    raise
                kaleido.stop_sync_server(silence_warnings=True)
                self._start()
                png = kaleido.calc_fig_sync(fig_dict, opts=opts)
            return {"image/png": base64.b64encode(png).decode()}
    return KaleidoPng()


def use_static_figures(png: bool | None = None) -> str:
    """Set plotly's default renderers to the interactive mimetype + offline HTML (+ PNG where
    a Chromium is installed, or as `png` says); embed plotly.js once. Returns the renderer names."""
    import plotly.io as pio
    from IPython.display import display
    from plotly.offline import get_plotlyjs

    from ..report.figures import find_chromium

    pio.renderers["gemref_html"] = _html_renderer()
    names = ["plotly_mimetype", "gemref_html"]
    if png if png is not None else find_chromium() is not None:
        pio.renderers["gemref_png"] = _png_renderer()
        names.append("gemref_png")
    pio.renderers.default = "+".join(names)
    script = f"<script>window.PlotlyConfig = {{MathJaxConfig: 'local'}};</script>\n<script>{get_plotlyjs()}</script>"
    display({"text/html": script}, raw=True)
    return pio.renderers.default


