"""Shell checks on the tree-sitter-bash parse: each rule fires on its case; normal scripts pass."""

from __future__ import annotations

import pytest

from sandcell.policy.checks import Finding, check, check_shell

PIPELINE = "cut -d, -f2 data.csv | sort | uniq -c"

SCRIPT = """\
#!/usr/bin/env bash
set -euo pipefail
shopt -s nullglob
mkdir -p out /tmp/work
for f in /inputs/*.csv; do
  n=$(wc -l < "$f")
  printf '%s,%s\\n' "$(basename "$f")" "$n" >> out/counts.csv
done
[[ -s out/counts.csv ]] && sort -t, -k2 -n out/counts.csv | tail -n 5 > out/top.txt
awk -F, '{ s += $2 } END { print s }' out/counts.csv 2>/dev/null | tee out/total.txt
grep -E '^(a|b)' /inputs/notes.txt | sed -e 's/a/b/g' > /sandbox/notes.txt 2> err.txt || true
jq -r '.items[] | .name' /inputs/data.json | sort -u > names.txt
python3 analyse.py --input /inputs/data.csv --out out/
case "${MODE:-fast}" in fast) echo fast ;; *) echo slow ;; esac
cp out/top.txt out/top-copy.txt && rm -rf out/tmp /tmp/work
sleep 1 & wait
"""


def findings(code: str, *, network: bool = False) -> list[Finding]:
    return check_shell(code, network=network)


def rules(code: str, *, network: bool = False) -> set[str]:
    return {f.rule_id for f in findings(code, network=network)}


def only(code: str, rule: str, *, network: bool = False) -> list[Finding]:
    return [f for f in findings(code, network=network) if f.rule_id == rule]


def test_ordinary_pipeline_has_no_findings() -> None:
    assert findings(PIPELINE) == []


def test_ordinary_script_has_no_weighty_findings() -> None:
    assert [f for f in findings(SCRIPT) if f.severity != "info"] == []


def test_check_dispatches_bash() -> None:
    assert check("wget x", "bash", allowed_imports=None, network=False)[0].rule_id == "sh.network"


# -- sh.syntax -----------------------------------------------------------------------------------


def test_syntax_error_is_a_deny_with_location() -> None:
    (f,) = only("echo ok\nif [ -f x ; then\n", "sh.syntax")
    assert f.severity == "deny" and f.line == 2 and "does not parse" in f.message
    (f,) = only("echo ok\nfor x in a b; do echo $x\n", "sh.syntax")
    assert f.line == 2 and "'done' is missing" in f.message


def test_read_write_redirect_is_not_a_syntax_error() -> None:
    # tree-sitter-bash 0.25 does not know `<>`; valid bash must not be denied for it.
    assert rules("exec 3<>out.txt") == set()


# -- sh.network ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code",
    [
        "curl -s https://example.com",
        "wget -q https://example.com/x",
        "nc example.com 80",
        "ncat -l 8080",
        "ssh user@host ls",
        "scp a user@host:/tmp",
        "rsync -a data/ host:/backup/",
        "telnet example.com",
        "ftp example.com",
        "git clone https://example.com/r.git",
        "cat < /dev/tcp/example.com/80",
        "echo x > /dev/udp/10.0.0.1/53",
        "x=$(curl -s https://example.com)",
        "sudo -u nobody curl https://example.com",
    ],
)
def test_network_tools_without_a_network(code: str) -> None:
    assert "sh.network" in rules(code)
    assert "sh.network" not in rules(code, network=True)


def test_network_quiet_on_local_lookalikes() -> None:
    assert rules("rsync -a data/ backup/\ngit status\ngit log --oneline\nhostname") == set()


# -- sh.package ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code",
    [
        "pip install requests",
        "pip3 install -U numpy",
        "python -m pip install x",
        "python3 -m pip install x",
        "apt-get install -y jq",
        "sudo apt update",
        "yum install x",
        "dnf install x",
        "apk add curl",
        "npm install left-pad",
        "yarn add x",
        "gem install rails",
        "cargo install ripgrep",
        "conda install pandas",
    ],
)
def test_package_managers(code: str) -> None:
    (f,) = only(code, "sh.package", network=True)
    assert f.severity == "warning" and "runtime image" in f.message


def test_package_quiet_on_listing() -> None:
    assert rules("pip list\npip freeze > req.txt\nnpm ls\ncargo build") == set()


# -- sh.pipe-to-shell ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code",
    [
        "curl -fsSL https://example.com/i.sh | sh",
        "wget -qO- https://example.com/i.sh | bash",
        "curl -s https://example.com/x.py | python3",
        "curl -s https://example.com/i.sh | sudo bash -s -- --yes",
        "bash <(curl -s https://example.com/i.sh)",
        'sh -c "$(curl -fsSL https://example.com/i.sh)"',
        'eval "$(wget -qO- https://example.com/env)"',
        "source <(curl -s https://example.com/env)",
    ],
)
def test_pipe_to_shell_is_a_deny_even_with_network(code: str) -> None:
    (f,) = only(code, "sh.pipe-to-shell", network=True)
    assert f.severity == "deny"


def test_pipe_quiet_when_the_shell_runs_a_file() -> None:
    assert rules("curl -s https://example.com | bash script.sh", network=True) == set()


# -- sh.write-outside ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code",
    [
        "echo x > /etc/passwd",
        "echo x >> /root/.bashrc",
        "cmd &> /var/log/x",
        "echo x | tee -a /etc/hosts",
        "cp payload /usr/local/bin/",
        "mv a /opt/b",
        "touch ~/.profile",
        "mkdir -p /srv/data",
        "rm -f /etc/motd",
        "dd if=/dev/zero of=/var/tmp/big bs=1M count=1",
        "echo x > ../../outside.txt",
        "cp -t /etc a b",
    ],
)
def test_writes_outside_the_workspace(code: str) -> None:
    (f,) = only(code, "sh.write-outside")
    assert f.severity == "warning" and "/sandbox" in f.message


def test_writes_inside_the_workspace_are_quiet() -> None:
    code = (
        "echo x > out.txt\necho y > /sandbox/a\necho z > /tmp/b\nls > /dev/null 2>&1\n"
        "cp /inputs/a.csv ./a.csv\ntee out/log < /inputs/x\nmkdir -p /sandbox/out"
    )
    assert rules(code) == set()


def test_writable_roots_are_configurable() -> None:
    assert check_shell("echo x > /data/out", network=False, writable_roots=["/data"]) == []


# -- sh.destroy ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code",
    [
        "rm -rf /",
        "rm -rf /*",
        "rm -fr -- /",
        "rm -r -f //",
        "rm -rf --no-preserve-root /",
        "sudo rm -rf /",
        "find / -delete",
        "mkfs.ext4 /dev/sda1",
        "dd if=/dev/zero of=/dev/sda",
        ":(){ :|:& };:",
    ],
)
def test_destroy_is_a_deny(code: str) -> None:
    assert [f.severity for f in only(code, "sh.destroy")] == ["deny"]


def test_destroy_quiet_on_workspace_cleanup() -> None:
    assert rules("rm -rf out/ build /tmp/work\nrm -f ./*.tmp") == set()


# -- sh.background -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code",
    ["sleep 100 &", "nohup python3 serve.py", "setsid worker", "job & disown", "(sleep 9 &)"],
)
def test_background_processes(code: str) -> None:
    found = only(code, "sh.background")
    assert found and all(f.severity == "warning" for f in found)
    assert "outlives" in found[0].message


def test_background_that_is_waited_for_is_info() -> None:
    (f,) = only("for i in 1 2 3; do work $i & done\nwait", "sh.background")
    assert f.severity == "info"
    (f,) = only("(work &)\nwait", "sh.background")
    assert f.severity == "warning"


def test_and_and_is_not_background() -> None:
    assert rules("make && echo done || echo failed\ncmd 2>&1 >/dev/null") == set()


# -- sh.eval -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code",
    [
        'eval "$cmd"',
        "source $(mktemp)",
        '"$TOOL" --flag',
        'bash -c "$SCRIPT"',
        "some_output | sh",
    ],
)
def test_eval_of_computed_code(code: str) -> None:
    assert [f.severity for f in only(code, "sh.eval")] == ["warning"]


def test_eval_of_decoded_payload_is_a_deny() -> None:
    (f,) = only("echo ZWNobyBoaQ== | base64 -d | bash", "sh.eval")
    assert f.severity == "deny"


def test_eval_of_a_literal_is_checked_not_flagged() -> None:
    assert rules("eval 'echo hello'") == set()
    assert rules("eval 'wget https://example.com'") == {"sh.network"}


def test_source_of_a_file_is_quiet() -> None:
    assert rules(". ./env.sh\nsource /inputs/config.sh") == set()


# -- nesting and locations -----------------------------------------------------------------------


def test_bash_c_string_is_checked_with_its_location() -> None:
    (f,) = only('echo start\nbash -c "echo ok; wget -q x"', "sh.network")
    assert (f.line, f.column) == (2, 19) and "in the `bash -c` string" in f.message


def test_heredoc_python_is_checked_with_its_line() -> None:
    code = "python3 - <<'EOF'\nimport os\nos.system('id')\nEOF\n"
    (f,) = [f for f in findings(code) if f.rule_id == "py.process"]
    assert (f.line, f.column) == (3, 1)


def test_herestring_and_functions_and_subshells() -> None:
    assert rules("bash <<< 'curl x'") == {"sh.network"}
    assert rules('get() { wget -q "$1"; }\nget x') == {"sh.network"}
    assert rules("( cd /tmp && nc -l 9 )") == {"sh.network"}
    assert rules("echo `curl x`") == {"sh.network"}


def test_columns_are_one_based_characters() -> None:
    (f,) = only("echo é€; curl x", "sh.network")
    assert (f.line, f.column) == (1, 10)
