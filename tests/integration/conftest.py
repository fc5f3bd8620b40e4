"""Fixtures for integration tests: real tritonserver processes with private /dev/shm."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'rig'))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), 'containers'))
# tests/fakes/loopback.py: the loopback socket peers (hostile servers), shared with the unit tests
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'fakes'))

import engines  # noqa: E402  pylint: disable=wrong-import-position
import tritonrig  # noqa: E402  pylint: disable=wrong-import-position

# The fixtures of the container harness. Tests that use them (or whose module imports the harness) run one after
# the other in one pytest-xdist worker: one dockerd at a time per machine (engines.LOCK_FILE), one podman.
ENGINE_FIXTURES = frozenset({'docker_daemon', 'podman_engine', 'container_engine'})
ENGINES_GROUP = 'engines'


def xdist_group(item: pytest.Item) -> str | None:
    """The pytest-xdist group of a test (`make integration` runs with `-n 2 --dist loadgroup`).

    An explicit `xdist_group` mark wins; the container harness's tests form one group; the tests of a module with a
    module-scoped fixture (a server started once for the module) form the module's group, so that the fixture is set
    up once, in one worker; every other test may run in either worker.
    """
    if item.get_closest_marker('xdist_group') is not None:
        return None
    if ENGINE_FIXTURES & set(item.fixturenames) or getattr(item.module, 'engines', None) is engines:
        return ENGINES_GROUP
    module = item.nodeid.split('::')[0]
    fixtureinfo = getattr(item, '_fixtureinfo', None)
    defs = fixtureinfo.name2fixturedefs.values() if fixtureinfo is not None else ()
    if any(d.baseid == module and d.scope in ('module', 'class') for fixturedefs in defs for d in fixturedefs):
        return module
    return None


def _with_group_suffix(item: pytest.Item) -> None:
    """What pytest-xdist's worker does for --dist loadgroup (the scheduler reads the group from 'NODEID@GROUP').

    pytest-xdist 3.8.0 writes item._nodeid, which pytest 9.2 no longer reads (it keeps a structured Node._id): the
    groups were silently ignored (pytest-dev/pytest-xdist#1386; #1388 proposes this same fix). A pytest-xdist that
    has the suffix on the id already is left alone.
    """
    names = sorted(
        {
            str(mark.args[0] if mark.args else mark.kwargs.get('name', 'default'))
            for mark in item.iter_markers('xdist_group')
        }
    )
    if not names or '@' in item.nodeid.rpartition(']')[2]:
        return
    from _pytest.nodeid import NodeId  # pylint: disable=import-outside-toplevel

    item._id = NodeId.parse(f'{item.nodeid}@{"_".join(names)}')  # pylint: disable=protected-access


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's worker reads the marks
def pytest_collection_modifyitems(config, items):
    if os.geteuid() != 0:
        skip = pytest.mark.skip(reason='integration tests need root: mount namespaces for private /dev/shm')
        for item in items:
            item.add_marker(skip)
    for item in items:
        group = xdist_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
        if getattr(config.option, 'loadgroup', False) and hasattr(item, '_id'):  # an xdist worker, --dist loadgroup
            _with_group_suffix(item)


@pytest.fixture
def fleet(tmp_path):
    """Two real servers with a 32 MiB /dev/shm each and no models; a test file that needs another fleet defines its own."""
    f = tritonrig.Fleet(2, workdir=str(tmp_path), shm_size='32m', models=())
    try:
        f.start()
        yield f
    finally:
        f.stop()


@pytest.fixture
def triton(tmp_path):
    """A started server (64 MiB private /dev/shm, echo python model); stopped after the test."""
    server = tritonrig.TritonServer(workdir=str(tmp_path), shm_size='64m')
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def make_triton(tmp_path):
    """Factory for extra servers: make_triton(shm_size='16m', models=(), host=...)."""
    servers = []

    def factory(**kwargs):
        kwargs.setdefault('workdir', str(tmp_path))
        kwargs.setdefault('name', 'triton%d' % (len(servers) + 1))
        server = tritonrig.TritonServer(**kwargs)
        servers.append(server)
        return server.start()

    try:
        yield factory
    finally:
        for server in servers:
            server.stop()


# --- no silent skips: a test that did not run is not a pass ---
# As root (where `make test` installs podman, Docker, Chromium and the rest itself), a skipped integration test fails
# the run, with its reason: a missing engine must not turn the container tests into green dots. Skips that say the
# server under test has no such feature (tritonrig.NOT_ON_THIS_VERSION, the Triton 2.48 matrix) are expected.
# TRITONOPS_ALLOW_SKIPS=1 lets a developer run without an engine anyway.
_SKIPPED: list[tuple[str, str]] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.skipped and not hasattr(report, 'wasxfail'):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if not reason.startswith(('Skipped: ' + tritonrig.NOT_ON_THIS_VERSION, tritonrig.NOT_ON_THIS_VERSION)):
            _SKIPPED.append((report.nodeid, reason))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if hasattr(session.config, 'workerinput') or not _SKIPPED or os.geteuid() != 0:
        return
    if os.environ.get('TRITONOPS_ALLOW_SKIPS') == '1':
        return
    reporter = session.config.pluginmanager.get_plugin('terminalreporter')
    if reporter is not None:
        reporter.section('skipped integration tests fail the run (TRITONOPS_ALLOW_SKIPS=1 to allow)', red=True)
        for nodeid, reason in _SKIPPED:
            reporter.line(f'{nodeid}: {reason}', red=True)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


# --- real container engines (tests/integration/containers/engines.py) ---


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Keep each phase's report on the item, so teardown can show container logs of a failed test."""
    outcome = yield
    setattr(item, 'rep_' + call.when, outcome.get_result())


def _engine_or_skip(factory):
    try:
        return factory().start()
    except engines.EngineUnavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope='session')
def docker_daemon():
    """The private dockerd (userland proxy on); `.set_userland_proxy(False)` restarts it without. Stopped at the end."""
    daemon = _engine_or_skip(engines.DockerDaemon)
    try:
        yield daemon
    finally:
        daemon.stop()


@pytest.fixture(scope='session')
def podman_engine():
    """Rootful podman in a private mount namespace; its containers are removed at the end."""
    podman = _engine_or_skip(engines.Podman)
    try:
        yield podman
    finally:
        podman.stop()


@pytest.fixture(params=['docker', 'podman'])
def container_engine(request):
    """docker_daemon or podman_engine, parametrized.

    `@pytest.mark.parametrize('container_engine', [...], indirect=True)` picks from
    'docker', 'docker-noproxy' (the same daemon restarted with
    --userland-proxy=false for this test, restarted with the proxy after it) and
    'podman'. The containers a test creates are removed after it; when it
    failed, their log tails are printed.
    """
    engine = request.getfixturevalue('podman_engine' if request.param == 'podman' else 'docker_daemon')
    if engine.name == 'docker':
        engine.set_userland_proxy(request.param != 'docker-noproxy')
    mark = engine.mark()
    try:
        yield engine
    finally:
        report = getattr(request.node, 'rep_call', None)
        if report is not None and report.failed:
            for cid in engine.created[mark:]:
                print('--- %s container %s log ---\n%s' % (engine.name, cid[:12], engine.log_tail(cid)))
        engine.remove_since(mark)
        if engine.name == 'docker' and not engine.userland_proxy:
            engine.set_userland_proxy(True)


@pytest.fixture
def forwarder():
    """Factory: forwarder(url) -> a started socat Forwarder on 127.0.0.1 (stopped after the test)."""
    started = []

    def factory(url, **kwargs):
        fwd = engines.Forwarder(url, **kwargs)
        started.append(fwd)
        return fwd.start()

    try:
        yield factory
    finally:
        for fwd in started:
            fwd.stop()
