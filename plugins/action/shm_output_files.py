# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Action tritonops.shm.shm_output_files: write report files on the controller by the one writer of outputs.

Runs in the controller's process (no module is sent anywhere): the report playbook's and the cleanup role's files in
one task, where a task per file cost a process each. The directory and the writing are module_utils/outputs/outputs.py's.
"""

from __future__ import annotations

import os
from typing import Any

from ansible.plugins.action import ActionBase
from ansible.plugins.filter.core import to_nice_json

from ansible_collections.tritonops.shm.plugins.module_utils.outputs import outputs

ARGUMENT_SPEC = {
    'dir': {'type': 'path', 'required': True},
    'files': {'type': 'dict', 'required': True},
    'mode': {'type': 'str', 'default': '0644'},
    'label': {'type': 'str', 'default': 'dir'},
}


def _mode(text: str) -> int | None:
    """An octal mode of a regular file nobody may execute (0644, 0640, 0600 ...), or None."""
    try:
        mode = int(str(text), 8)
    except ValueError:
        return None
    return mode if 0 <= mode <= 0o666 and not mode & 0o111 else None


def _text(content: Any) -> str | None:
    """What a file gets: a string as it is, a dict or list as Ansible's to_nice_json (indent 2) and a newline."""
    if isinstance(content, str):
        return content
    if isinstance(content, (dict, list)):
        # a template of JSON text may come back as data (ansible-core before 2.19 converts it): written as JSON either way
        return to_nice_json(content, indent=2) + '\n'
    return None


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(ARGUMENT_SPEC)

    def run(self, tmp: Any = None, task_vars: dict | None = None) -> dict:
        result = super().run(tmp, task_vars)
        del tmp  # unused: nothing is sent to a host
        _validation, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        directory, files, label = args['dir'], args['files'], args['label']
        result.update(changed=False, dir=directory, written=[])  # an output is never a change (DESIGN invariant 11)
        mode = _mode(args['mode'])
        if mode is None:
            return dict(
                result,
                failed=True,
                msg=f'mode must be an octal file mode without execute bits, e.g. 0644, got {args["mode"]!r}',
            )
        # a file that cannot be written is said, and every other file is still written: nothing else is lost for it
        refused = {name: outputs.plain_name(name) for name in files}
        texts = {name: _text(content) for name, content in files.items() if not refused[name]}
        for name, text in texts.items():
            if text is None:
                kind = type(files[name]).__name__
                refused[name] = f'the content of {name} must be a string, a dict or a list, got {kind}'
        texts = {name: text for name, text in texts.items() if text is not None}
        problems = [why for why in refused.values() if why]
        why = outputs.report_dir_refusal(directory)
        if why:
            return dict(result, failed=True, msg=f'{label} {why}')
        if self._task.check_mode:
            result['msg'] = 'check mode: nothing written (run the task with check_mode: false to write the outputs)'
            result['would_write'] = [os.path.join(directory, name) for name in sorted(texts)]
            return dict(result, failed=True, msg='; '.join(problems)) if problems else result
        if not texts:
            return dict(result, failed=True, msg=f'{label}: ' + '; '.join(problems))
        why = outputs.make_dir(directory)
        if why:
            return dict(result, failed=True, msg=f'{label} {why}')
        for name in sorted(texts):
            done = outputs.write(directory, name, texts[name], nothing='not written', mode=mode)
            if done.written:
                result['written'].append(done.path)
            else:
                problems.append(done.warning)
        if problems:
            return dict(result, failed=True, msg=f'{label}: ' + '; '.join(problems))
        return result
