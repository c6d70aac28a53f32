# VM test: the sandbox is cut off from the network and runs unprivileged, for root (the image
# preloaded at boot), for a lingering normal user (rootless; the image loaded on first use) and
# for the HTTP service (`services.mcp-code-bridge.http`, on its default loopback address).
#
# Every network check of the sandbox has a positive control: the VM serves what the sandbox must
# not reach (an HTTP listener on :: for IPv4 and IPv6, a DNS responder on UDP 53 of every address,
# which is also the VM's resolver), and the same checks, run first in a container *with* a
# network (a dual-stack podman network), must all succeed. So each failure in the sandbox is the
# sandbox's doing, and each check is one that can fail.
#
# With `gvisor = true` (checks.<system>.nixos-sandbox-gvisor) the module's gvisor.enable is on:
# the same probe runs in sandboxes that podman creates with gVisor's runsc, and the test also
# checks that they run on gVisor's kernel, not the VM's. The configuration says
# `allow_unenforced_limits = true` (the module refuses gvisor.enable without a choice): the
# rootless user's bridge runs under gVisor, and doctor names the limits the host does not apply
# to it; with `false` in the user's own config.toml it refuses, naming them.
#
# The files the VM runs are written into /etc/mcp-code-bridge-test as text, and the responder
# runs from there: scripts/nix-pieces.sh takes them, and the units' command lines, from the
# offline evaluation of this test and runs them on Debian (docs/nix.md, VM tests).
{
  pkgs,
  module,
  gvisor ? false,
}:

let
  port = 8000;
  name = "bridge-probe.test";
  testDir = "mcp-code-bridge-test";
  isolation = if gvisor then "gvisor" else "container";

  # `replaceVars` as text: every @name@ of `vars` replaced, and none left.
  render =
    file: vars:
    let
      names = builtins.attrNames vars;
      text = builtins.replaceStrings (map (n: "@${n}@") names) (map (n: toString vars.${n}) names) (
        builtins.readFile file
      );
      left = builtins.filter builtins.isList (builtins.split "(@[a-zA-Z_][a-zA-Z0-9_]*@)" text);
    in
    if left == [ ] then text else throw "${baseNameOf file}: ${builtins.head (builtins.head left)} is not substituted";
in
pkgs.testers.runNixOSTest {
  name = "mcp-code-bridge-sandbox" + pkgs.lib.optionalString gvisor "-gvisor";

  nodes.machine =
    { config, ... }:
    let
      ipv4 = config.networking.primaryIPAddress;
      # `or`: the offline evaluation stub's test driver sets only primaryIPAddress; NixOS's test
      # framework sets both (this is the address it gives the first node).
      ipv6 = config.networking.primaryIPv6Address or "2001:db8:1::1";
      probe =
        mode:
        render ./sandbox_probe.py {
          inherit
            mode
            isolation
            ipv4
            ipv6
            name
            port
            ;
        };
    in
    {
      imports = [ module ];

      virtualisation = {
        memorySize = 4096;
        diskSize = 8192;
        cores = 2;
      };

      services.mcp-code-bridge = {
        enable = true;
        preloadImage = true;
        gvisor.enable = gvisor;
        # The module's gVisor asks for the choice (nix/common.nix, gvisorAssertions).
        settings = pkgs.lib.optionalAttrs gvisor { allow_unenforced_limits = true; };
        # On the bridge's default address, loopback: no token.
        http.enable = true;
      };

      users.users.alice = {
        isNormalUser = true;
        uid = 1000;
        linger = true;
      };

      # What the sandbox must not reach, on every address of the VM.
      systemd.services.probe-http = {
        wantedBy = [ "multi-user.target" ];
        after = [ "network.target" ];
        serviceConfig = {
          # `--bind ::` is one dual-stack socket (http.server turns IPV6_V6ONLY off).
          ExecStart = "${pkgs.python3}/bin/python3 -m http.server ${toString port} --bind :: --directory /var/empty";
          DynamicUser = true;
        };
      };
      systemd.services.probe-dns = {
        wantedBy = [ "multi-user.target" ];
        after = [ "network.target" ];
        serviceConfig = {
          ExecStart = "${pkgs.python3}/bin/python3 /etc/${testDir}/probe_dns.py";
          DynamicUser = true;
          AmbientCapabilities = [ "CAP_NET_BIND_SERVICE" ];
        };
      };
      # The VM's resolver is that responder: a container with a network gets it in its
      # resolv.conf (podman copies the host's), so it resolves `name`.
      networking.nameservers = [ ipv4 ];
      networking.firewall = {
        allowedTCPPorts = [ port ];
        allowedUDPPorts = [ 53 ];
      };

      environment.etc = {
        "${testDir}/probe.py".text = probe "sandbox";
        "${testDir}/control.py".text = probe "control";
        "${testDir}/probe_dns.py".text = render ./probe_dns.py { inherit name ipv4 ipv6; };
      };
    };

  testScript =
    { nodes, ... }:
    let
      settings = nodes.machine.services.mcp-code-bridge.settings;
    in
    ''
      import json
      import re
      import shlex

      IMAGE = "${settings.image}"
      PROBE = "/etc/${testDir}/probe.py"
      CONTROL = "/etc/${testDir}/control.py"
      GVISOR = ${if gvisor then "True" else "False"}
      RUNTIME = "${settings.gvisor_runtime or ""}"
      CURL = "${pkgs.curl}/bin/curl"


      def as_alice(cmd: str) -> str:
          env = "export XDG_RUNTIME_DIR=/run/user/1000 DBUS_SESSION_BUS_ADDRESS=unix:path=/run/user/1000/bus; "
          return "su alice -l -c " + shlex.quote(env + cmd)


      def kernel_of(out: str) -> str:
          return [l.split("=", 1)[1] for l in out.splitlines() if l.startswith("KERNEL=")][0]


      def on_expected_kernel(kernel: str) -> None:
          # runc/crun: the VM's own kernel; gVisor: its own, which is not the VM's.
          if GVISOR:
              assert kernel != host_kernel, (kernel, host_kernel)
          else:
              assert kernel == host_kernel, (kernel, host_kernel)


      def sandbox_probe(out: str) -> None:
          print(out)
          assert "SANDBOX-PROBE-OK" in out, out
          on_expected_kernel(kernel_of(out))


      def mcp_http(code: str) -> str:
          """run_python over MCP at the HTTP service (initialize, initialized, tools/call)."""
          url = "http://127.0.0.1:8931/mcp"
          accept = "-H 'content-type: application/json' -H 'accept: application/json, text/event-stream'"

          def post(body, extra=""):
              return machine.succeed(
                  f"{CURL} -s -D - {accept} {extra} -X POST {url} --data {shlex.quote(json.dumps(body))}"
              )

          out = post({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
              "protocolVersion": "2025-11-25", "capabilities": {},
              "clientInfo": {"name": "vm", "version": "1"}}})
          sid = [l.split(":", 1)[1].strip() for l in out.splitlines() if l.lower().startswith("mcp-session-id:")][0]
          session = f"-H 'mcp-session-id: {sid}' -H 'mcp-protocol-version: 2025-11-25'"
          post({"jsonrpc": "2.0", "method": "notifications/initialized"}, session)
          return post({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
              "name": "run_python", "arguments": {"code": code}}}, session)


      machine.wait_for_unit("multi-user.target")
      machine.wait_for_unit("mcp-code-bridge-image.service")
      machine.wait_for_unit("probe-http.service")
      machine.wait_for_unit("probe-dns.service")
      machine.wait_for_open_port(${toString port})
      host_kernel = machine.succeed("uname -r").strip()

      with subtest("the image was preloaded into root's storage at boot"):
          machine.succeed(f"podman image exists {IMAGE}")

      with subtest("positive control: a container with a dual-stack network reaches everything the sandbox must not"):
          # IPv6 is off on podman's default network; this one has an IPv4 and an IPv6 subnet, and
          # no DNS of its own, so the container's resolver is the VM's (the responder).
          machine.succeed("podman network create --ipv6 --disable-dns bridge-control")
          out = machine.succeed(
              f"podman run --rm --network bridge-control {IMAGE} python3 -c \"$(cat {CONTROL})\""
          )
          print(out)
          assert "CONTROL-OK" in out, out

      if GVISOR:
          with subtest("the module registered gVisor's runsc with podman; a container under it runs on gVisor's kernel"):
              out = machine.succeed(
                  f"podman run --rm --runtime {RUNTIME} {IMAGE} python3 -c 'import os; print(\"KERNEL=\" + os.uname().release)'"
              )
              assert kernel_of(out) != host_kernel, (out, host_kernel)

      with subtest("root: doctor is happy, and the limits are enforced"):
          out = machine.succeed("mcp-code-bridge doctor")
          print(out)
          assert "limits enforceable" in out, out

      with subtest("root: none of that reachable from the sandbox; uid 65534, read-only root, no capabilities, the engine's seccomp profile"):
          sandbox_probe(machine.succeed(f"mcp-code-bridge exec -f {PROBE}"))

      with subtest("root: an exception in the code makes exec fail"):
          machine.fail("mcp-code-bridge exec 'raise RuntimeError(\"boom\")'")

      with subtest("no container outlives exec"):
          machine.succeed('test -z "$(podman ps -q)"')

      with subtest("the HTTP service runs code in a sandbox on the expected kernel"):
          machine.wait_for_unit("mcp-code-bridge-http.service")
          machine.wait_for_open_port(8931)
          out = mcp_http("import os; print('KERNEL=' + os.uname().release)")
          print(out)
          kernel = re.search(r"KERNEL=([^\s\"\\]+)", out)
          assert kernel is not None, f"no KERNEL= line in run_python's answer: {out}"
          on_expected_kernel(kernel.group(1))

      machine.wait_for_unit("user@1000.service")

      if GVISOR:
          with subtest("rootless: doctor is happy, naming the limits gVisor does not apply (allow_unenforced_limits = true)"):
              out = machine.succeed(as_alice("mcp-code-bridge doctor"))
              print(out)
              assert "limits NOT enforced (allowed by allow_unenforced_limits)" in out, out
              assert "gVisor applies no cgroup limits to a rootless container" in out, out
      else:
          with subtest("rootless: doctor is happy, and the limits are enforced"):
              out = machine.succeed(as_alice("mcp-code-bridge doctor"))
              print(out)
              assert "limits enforceable" in out, out

      with subtest("rootless: the same sandbox, the image loaded from the archive on first use"):
          sandbox_probe(machine.succeed(as_alice(f"mcp-code-bridge exec -f {PROBE}")))
          machine.succeed(as_alice(f"podman image exists {IMAGE}"))

      with subtest("rootless: an exception in the code makes exec fail"):
          machine.fail(as_alice("mcp-code-bridge exec 'raise RuntimeError(\"boom\")'"))

      if GVISOR:
          with subtest("rootless, allow_unenforced_limits = false in the user's config.toml: refused, naming the limits"):
              machine.succeed(as_alice(
                  "mkdir -p ~/.config/mcp-code-bridge && echo 'allow_unenforced_limits = false' > ~/.config/mcp-code-bridge/config.toml"
              ))
              status, out = machine.execute(as_alice("mcp-code-bridge doctor"))
              print(out)
              assert status != 0, out
              assert "limits the host cannot enforce" in out, out
              assert "gVisor applies no cgroup limits to a rootless container" in out, out
              machine.fail(as_alice("mcp-code-bridge exec 'print(1)'"))
              machine.succeed(as_alice("rm ~/.config/mcp-code-bridge/config.toml"))
    '';
}
