"""``pofe annotate PAIRS --annotator ID -o CALIBRATION.jsonl``: label pairs in a local web page."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from pofe.cli.common import ConfigOpt, PrintConfigOpt, SetOpt, resolve_config


def register(app: typer.Typer) -> None:
    @app.command(help="Label pairs by hand in a local web page (127.0.0.1): prompt and two responses side by side "
                      "in a random order, keys 1 / 2 / t (tie) / s (skip) / u (undo). Every label is appended to "
                      "OUTPUT at once (resumable; one annotator id per person) and OUTPUT is a calibration set "
                      "for `pofe audit --calibration OUTPUT`.")
    def annotate(
        pairs: Optional[str] = typer.Argument(None, help="Pair file: pofe label output, an online ledger, "
                                                        "prompt/chosen/rejected or prompt/response_a/response_b rows."),
        annotator: Optional[str] = typer.Option(None, "--annotator", "-a", help="Your annotator id (e.g. alice)."),
        output: Optional[str] = typer.Option(None, "--output", "-o", help="Calibration file to write (resumed if it exists)."),
        limit: Optional[int] = typer.Option(None, "--limit", help="Label a seeded random subset of N pairs "
                                                                 "(the same N for every annotator)."),
        port: Optional[int] = typer.Option(None, "--port", help="Port (0 = any free port; the URL is printed)."),
        host: Optional[str] = typer.Option(None, "--host", help="Loopback address (127.0.0.1, ::1, localhost)."),
        config: Optional[Path] = ConfigOpt,
        set_: Optional[list[str]] = SetOpt,
        print_config: bool = PrintConfigOpt,
    ) -> None:
        from pofe.annotate.server import AnnotateConfig

        cfg = resolve_config(AnnotateConfig, config, set_, {
            "data.pairs": pairs, "annotator": annotator, "output": output, "data.limit": limit, "port": port,
            "host": host}, print_config)
        from pofe.annotate.server import make_server

        import signal
        import sys

        def _stop(*_):
            raise KeyboardInterrupt

        # Before the URL is printed: a SIGTERM sent as soon as the URL appears must stop the
        # server through the same path as Ctrl-C (lock released, summary printed).
        signal.signal(signal.SIGTERM, _stop)
        server = make_server(cfg)
        s = server.session
        c = s.counts()
        try:
            skipped = ", ".join(f"{v} {k}" for k, v in s.skipped_rows.items())
            typer.echo(f"pofe annotate: {server.url}", nl=True)
            if s.log.torn_bytes_dropped:
                typer.echo(f"  cut a torn last line ({s.log.torn_bytes_dropped} bytes, a write that was cut short and "
                           f"never acknowledged) off {cfg.output}")
            sub = f" (a seeded subset of {s.n_in_file})" if c["total"] < s.n_in_file else ""
            typer.echo(f"  {c['total']} pairs{sub} from {cfg.data.pairs}"
                       + (f" (rows skipped: {skipped})" if skipped else "")
                       + f"; annotator {cfg.annotator}: {c['labelled']} labelled, {c['skipped']} skipped so far"
                       + (f" ({s.foreign} more on pairs of other files)" if s.foreign else ""))
            typer.echo(f"  writing {cfg.output}; press Ctrl-C to stop (every label is already saved)")
            sys.stdout.flush()
            server.serve_forever(poll_interval=0.2)
        except KeyboardInterrupt:
            pass
        finally:
            server.server_close()
            c = s.counts()
            s.close()
        typer.echo(f"pofe annotate: stopped; {cfg.annotator}: {c['labelled']} labelled, {c['skipped']} skipped of "
                   f"{c['total']} in {cfg.output}")
