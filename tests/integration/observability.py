"""Real Prometheus, node_exporter and Alertmanager for the integration tests (Debian's binaries, never installed).

Each service is a process this module starts on a loopback port it chose, with its own data directory and log
file, and stops by pid (its own session). The binaries come from PROMETHEUS_BIN (the Makefile sets build/bin,
filled by .ci/get-prometheus).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable

import engines  # tests/integration/containers (conftest puts it on sys.path)
import pytest
import tritonrig
import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
COLLECTION = os.path.dirname(os.path.dirname(HERE))
RULES = os.path.join(COLLECTION, 'extensions', 'prometheus', 'tritonops_shm.rules.yml')
DASHBOARD = os.path.join(COLLECTION, 'extensions', 'grafana', 'tritonops-shm.json')
DEBIAN_TEMPLATES = '/usr/share/prometheus/alertmanager'


def binary(name: str) -> str:
    directory = os.environ.get('PROMETHEUS_BIN') or os.path.join(COLLECTION, 'build', 'bin')
    path = os.path.join(directory, name)
    if not os.access(path, os.X_OK):
        raise AssertionError(f'{path} not found: run `make prometheus` (.ci/get-prometheus) or set PROMETHEUS_BIN=DIR')
    return path


def http_get(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        body = resp.read()
    return json.loads(body) if body[:1] in (b'{', b'[') else body.decode()


def wait_for(
    what: str,
    predicate: Callable[[], Any],
    timeout: float,
    interval: float = 0.25,
    log: Callable[[], str] | None = None,
) -> Any:
    """predicate()'s first truthy value within timeout seconds, else an AssertionError naming what."""
    value = engines._wait(predicate, timeout, interval)  # pylint: disable=protected-access
    if not value:
        raise AssertionError(f'not within {timeout}s: {what}' + (f'\n{log()}' if log else ''))
    return value


class Service:
    """One process on 127.0.0.1:port, output in workdir/NAME.log, stopped by pid."""

    name = 'service'
    ready_path = '/-/ready'

    def __init__(self, workdir: Path) -> None:
        self.dir = Path(workdir) / f'{self.name}-{time.monotonic_ns()}'
        self.dir.mkdir(parents=True)
        self.port = tritonrig.free_port()
        self.url = f'http://127.0.0.1:{self.port}'
        self.log = self.dir / f'{self.name}.log'
        self.proc: subprocess.Popen | None = None

    def command(self) -> list:
        raise NotImplementedError

    def start(self) -> Service:
        with open(self.log, 'wb') as out:
            self.proc = subprocess.Popen(
                self.command(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=str(self.dir),
                start_new_session=True,
            )
        return self

    def output(self) -> str:
        return self.log.read_text(errors='replace')[-4000:]

    def ready(self) -> bool:
        assert self.proc is not None and self.proc.poll() is None, f'{self.name} exited:\n{self.output()}'
        try:
            with urllib.request.urlopen(self.url + self.ready_path, timeout=2) as resp:
                return resp.status == 200
        except (urllib.error.URLError, ConnectionError, OSError):
            return False

    def wait_ready(self, timeout: float = 30) -> Service:
        wait_for(f'{self.name} ready on {self.url}', self.ready, timeout, log=self.output)
        return self

    def stop(self) -> None:
        tritonrig._kill(self.proc)  # pylint: disable=protected-access  # SIGTERM by pid, SIGKILL after a grace


class NodeExporter(Service):
    """node_exporter with only the textfile collector, reading textfile_dir."""

    name = 'node_exporter'
    ready_path = '/metrics'

    def __init__(self, workdir: Path, textfile_dir: Path) -> None:
        super().__init__(workdir)
        self.textfile_dir = Path(textfile_dir)

    def command(self) -> list:
        return [
            binary('prometheus-node-exporter'),
            f'--web.listen-address=127.0.0.1:{self.port}',
            '--collector.disable-defaults',
            '--collector.textfile',
            f'--collector.textfile.directory={self.textfile_dir}',
        ]

    def metrics(self) -> str:
        return http_get(self.url + '/metrics')


class Alertmanager(Service):
    """Alertmanager sending every alert to one webhook with a bearer token; group_wait 0, no cluster."""

    name = 'alertmanager'

    def __init__(self, workdir: Path, webhook_url: str, token: str) -> None:
        super().__init__(workdir)
        config = {
            'route': {
                'receiver': 'tritonops',
                'group_by': ['alertname', 'host', 'triton_url'],
                'group_wait': '0s',
                'group_interval': '1s',
                'repeat_interval': '1h',
            },
            'receivers': [
                {
                    'name': 'tritonops',
                    'webhook_configs': [
                        {
                            'url': webhook_url,
                            'send_resolved': True,
                            'http_config': {'authorization': {'type': 'Bearer', 'credentials': token}},
                        }
                    ],
                }
            ],
        }
        self.config = self.dir / 'alertmanager.yml'
        self.config.write_text(yaml.safe_dump(config))

    def notifications(self) -> tuple:
        """(sent, failed): the webhook notifications Alertmanager made so far, from its own /metrics."""
        text = http_get(self.url + '/metrics')

        def total(name: str) -> float:
            found = re.search(r'^%s\{[^}]*integration="webhook"[^}]*\} (\S+)$' % name, text, re.M)
            return float(found.group(1)) if found else 0.0

        return total('alertmanager_notifications_total'), total('alertmanager_notifications_failed_total')

    def command(self) -> list:
        am = binary('prometheus-alertmanager')
        cmd = [
            am,
            f'--config.file={self.config}',
            f'--storage.path={self.dir / "data"}',
            f'--web.listen-address=127.0.0.1:{self.port}',
            '--cluster.listen-address=',
        ]
        if os.path.exists(DEBIAN_TEMPLATES + '/default.tmpl'):
            return cmd
        # Debian's build reads its templates from /usr/share/prometheus/alertmanager, which a package
        # install provides; .ci/get-prometheus extracts them next to the binary instead: lay that tree
        # over /usr/share in a private mount namespace of this process only
        share = os.path.normpath(os.path.join(os.path.dirname(am), '..', 'share'))
        assert os.path.exists(share + '/prometheus/alertmanager/default.tmpl'), f'{share}: run `make prometheus`'
        script = f'mount -t overlay tritonops-am -o lowerdir={share}:/usr/share /usr/share && exec "$@"'
        return ['unshare', '--mount', '--propagation', 'private', 'sh', '-c', script, 'alertmanager'] + cmd


class Prometheus(Service):
    """Prometheus scraping targets and evaluating rule_files every second, alerting to alertmanager_urls."""

    name = 'prometheus'

    def __init__(self, workdir: Path, targets: list, rule_files: tuple = (), alertmanager_urls: tuple = ()) -> None:
        super().__init__(workdir)
        config = {
            'global': {'scrape_interval': '1s', 'evaluation_interval': '1s', 'scrape_timeout': '1s'},
            'scrape_configs': [{'job_name': 'node', 'static_configs': [{'targets': list(targets)}]}],
            'rule_files': [str(p) for p in rule_files],
        }
        if alertmanager_urls:
            config['alerting'] = {
                'alertmanagers': [
                    {'static_configs': [{'targets': [urllib.parse.urlsplit(u).netloc for u in alertmanager_urls]}]}
                ]
            }
        self.config = self.dir / 'prometheus.yml'
        self.config.write_text(yaml.safe_dump(config))

    def command(self) -> list:
        return [
            binary('prometheus'),
            f'--config.file={self.config}',
            f'--storage.tsdb.path={self.dir / "data"}',
            f'--web.listen-address=127.0.0.1:{self.port}',
            '--rules.alert.resend-delay=1s',
        ]

    def api(self, path: str, **params: str) -> Any:
        answer = http_get(f'{self.url}/api/v1/{path}?{urllib.parse.urlencode(params)}')
        assert answer['status'] == 'success', answer
        return answer['data']

    def query(self, expr: str) -> list:
        """The instant vector of expr now (query errors raise)."""
        try:
            data = self.api('query', query=expr)
        except urllib.error.HTTPError as exc:
            raise AssertionError(f'query {expr!r}: {exc.read().decode(errors="replace")}') from exc
        return data['result']

    def alerts(self, name: str, state: str = 'firing') -> list:
        return [a for a in self.api('alerts')['alerts'] if a['labels']['alertname'] == name and a['state'] == state]

    def scraped(self, expr: str) -> bool:
        return bool(self.query(expr))


@pytest.fixture
def services():
    """services(x): start a Service (or take any started object with stop()); all stopped at the end, last first."""
    started = []

    def start(service):
        if isinstance(service, Service):
            service.start()
        started.append(service)
        return service

    try:
        yield start
    finally:
        for service in reversed(started):
            service.stop()


def rules_with_short_for(workdir: Path, seconds: int = 1) -> Path:
    """The collection's alert rules, expressions, labels and annotations as shipped, each `for` shortened to seconds."""
    with open(RULES) as f:
        rules = yaml.safe_load(f)
    for group in rules['groups']:
        for rule in group['rules']:
            if 'for' in rule:
                rule['for'] = f'{seconds}s'
    path = Path(workdir) / 'tritonops_shm.rules.yml'
    path.write_text(yaml.safe_dump(rules, sort_keys=False))
    return path


def dashboard_queries(dashboard: dict, substitutions: dict) -> list:
    """[(panel title, expr with Grafana's variables substituted)] of every panel target, rows included."""

    def panels(items: list) -> list:
        out = []
        for panel in items:
            out.append(panel)
            out.extend(panels(panel.get('panels') or []))
        return out

    def substitute(expr: str) -> str:
        return re.sub(r'\$\{?(\w+)\}?', lambda m: substitutions.get(m.group(1), m.group(0)), expr)

    return [(p['title'], substitute(t['expr'])) for p in panels(dashboard['panels']) for t in p.get('targets') or ()]
