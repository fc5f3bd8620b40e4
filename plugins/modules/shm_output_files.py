#!/usr/bin/python
# Copyright: (c) 2026, tritonops.shm developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
# The documentation of action plugin tritonops.shm.shm_output_files (plugins/action/): it runs on the controller.

from __future__ import annotations

DOCUMENTATION = r"""
module: shm_output_files
short_description: Write report files on the controller, atomically, in one task
version_added: 0.3.0
description:
  - "Writes each of O(files) into O(dir) on the controller, by the collection's one writer of outputs: the directory is refused
    when it is a symlink, is reached through one, or is a relative path; each file is written to a hidden temporary name in the
    same directory, flushed to disk and renamed over its name, so that a reader sees the old file or the new one, never half,
    whatever the umask (O(mode))."
  - "The report playbook (C(report.json), C(report.md), C(report.html)) and the C(tritonops.shm.shm_cleanup) role (each host's
    record, C(summary.md), C(report.html)) write their files with it: one task for every file, where a task per file cost a
    process each."
  - "An output is never a change: the task reports C(changed=false) (docs/concepts.md, safety rule 14)."
  - "It runs in the controller's process whatever the play's hosts are: O(dir) is a controller path. Nothing is sent to a host,
    so C(become) and C(delegate_to) change nothing."
author:
  - tritonops.shm developers (@tritonops)
attributes:
  action:
    support: full
    description: An action plugin that runs on the controller only.
  check_mode:
    support: full
    description: Writes nothing and lists RV(would_write). The report playbook and the role run this task with C(check_mode)
      off, so that a check-mode run still leaves its report.
  diff_mode:
    support: none
    description: No diff; report files are outputs, not changes.
  idempotent:
    support: full
    description: Always C(changed=false); a second run writes the same files again.
  platform:
    support: full
    platforms: posix
    description: The controller.
options:
  dir:
    description:
      - The directory, an absolute path on the controller. Created with its missing parents (mode C(0755)) unless it exists.
      - Refused, with nothing written, when it or a directory on its way is a symlink (another user may have planted it to make
        the controller's user write where they choose), or when it is a relative path (Ansible runs a controller task in the
        playbook's or role's directory, inside the installed collection).
      - Refused too when another user could replace what is written there, that is when a directory on the way, or O(dir)
        itself, sits in a directory anyone may write in (such as C(/tmp)) and is not yours or root's (another user made it
        first), or is a directory anyone may write in without the sticky bit. Each directory is opened one at a time from C(/),
        never following a symlink, so a symlink swapped in after the check is refused as well.
    type: path
    required: true
  files:
    description:
      - What to write, a dict of file name to content. Each name is one plain file name, no C(/), not starting with C(.).
      - A name or a content that cannot be written fails the task with its reason, after every other file is written.
      - A string is written as it is (UTF-8); a dict or a list is written as JSON, as C(to_nice_json(indent=2)) writes it,
        with a newline.
    type: dict
    required: true
  mode:
    description:
      - The files' octal mode, whatever the umask, without execute bits.
    type: str
    default: '0644'
  label:
    description:
      - What the messages call O(dir), for example the playbook variable a user set (V(report_dir)).
    type: str
    default: dir
seealso:
  - module: tritonops.shm.triton_shm_info
  - plugin: tritonops.shm.shm_dir_refusal
    plugin_type: filter
    description: The same refusal of a directory, as a filter.
"""

EXAMPLES = r"""
- name: Write the fleet's report files
  tritonops.shm.shm_output_files:
    dir: /srv/reports/triton
    label: report_dir
    files:
      report.json: "{{ rows | to_nice_json(indent=2) }}"
      report.md: "{{ lookup('ansible.builtin.template', 'report.md.j2') }}"
  check_mode: false  # a check-mode run still leaves its report
"""

RETURN = r"""
dir:
  description: The directory.
  returned: always
  type: str
  sample: /srv/reports/triton
written:
  description: The paths written, in name order.
  returned: always
  type: list
  elements: str
  sample: [/srv/reports/triton/report.json, /srv/reports/triton/report.md]
would_write:
  description: In check mode, the paths that would be written.
  returned: in check mode
  type: list
  elements: str
  sample: [/srv/reports/triton/report.json]
"""
