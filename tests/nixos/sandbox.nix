# VM test: the sandbox is cut off from the network and runs unprivileged, for root (the image
# preloaded at boot) and for a lingering normal user (rootless; the image loaded on first use).
# A positive control first shows that the listener on the VM *is* reachable from a container with
# podman's default networking, so the sandbox's failures are the sandbox's doing.
{ pkgs, module }:

let
  port = 8000;
  probeDir = "/etc/mcp-code-bridge-test";
in
pkgs.testers.runNixOSTest {
  name = "mcp-code-bridge-sandbox";

  nodes.machine =
    { config, ... }:
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
      };

      users.users.alice = {
        isNormalUser = true;
        uid = 1000;
        linger = true;
      };

      networking.firewall.allowedTCPPorts = [ port ];

      environment.etc = {
        "mcp-code-bridge-test/probe.py".source = pkgs.replaceVars ./sandbox_probe.py {
          ipv4 = config.networking.primaryIPAddress;
          # `or`: the offline evaluation stub's test driver sets only primaryIPAddress; NixOS's
          # test framework sets both (this is the address it gives the first node).
          ipv6 = config.networking.primaryIPv6Address or "2001:db8:1::1";
          port = toString port;
        };
        "mcp-code-bridge-test/control.py".text = ''
          import urllib.request
          r = urllib.request.urlopen("http://${config.networking.primaryIPAddress}:${toString port}/", timeout=10)
          assert r.status == 200, r.status
          print("CONTROL-OK")
        '';
      };
    };

  testScript =
    { nodes, ... }:
    let
      image = nodes.machine.services.mcp-code-bridge.settings.image;
    in
    ''
      import shlex

      IMAGE = "${image}"
      PROBE = "${probeDir}/probe.py"
      CONTROL = "${probeDir}/control.py"


      def as_alice(cmd: str) -> str:
          env = "export XDG_RUNTIME_DIR=/run/user/1000 DBUS_SESSION_BUS_ADDRESS=unix:path=/run/user/1000/bus; "
          return "su alice -l -c " + shlex.quote(env + cmd)


      machine.wait_for_unit("multi-user.target")
      machine.wait_for_unit("mcp-code-bridge-image.service")

      with subtest("the image was preloaded into root's storage at boot"):
          machine.succeed(f"podman image exists {IMAGE}")

      with subtest("positive control: a container with default networking reaches the VM's listener"):
          machine.succeed(
              "systemd-run --unit=listener --property=WorkingDirectory=/tmp "
              "${pkgs.python3}/bin/python3 -m http.server ${toString port} --bind 0.0.0.0"
          )
          machine.wait_for_open_port(${toString port})
          out = machine.succeed(f"podman run --rm {IMAGE} python3 -c \"$(cat {CONTROL})\"")
          assert "CONTROL-OK" in out, out

      with subtest("root: doctor is happy"):
          print(machine.succeed("mcp-code-bridge doctor"))

      with subtest("root: no network, no DNS, no IPv6; uid 65534, read-only root, no capabilities"):
          out = machine.succeed(f"mcp-code-bridge exec -f {PROBE}")
          print(out)
          assert "SANDBOX-PROBE-OK" in out, out

      with subtest("root: an exception in the code makes exec fail"):
          machine.fail("mcp-code-bridge exec 'raise RuntimeError(\"boom\")'")

      with subtest("no container outlives exec"):
          machine.succeed('test -z "$(podman ps -q)"')

      machine.wait_for_unit("user@1000.service")

      with subtest("rootless: doctor is happy"):
          print(machine.succeed(as_alice("mcp-code-bridge doctor")))

      with subtest("rootless: the same sandbox, the image loaded from the archive on first use"):
          out = machine.succeed(as_alice(f"mcp-code-bridge exec -f {PROBE}"))
          print(out)
          assert "SANDBOX-PROBE-OK" in out, out
          machine.succeed(as_alice(f"podman image exists {IMAGE}"))

      with subtest("rootless: an exception in the code makes exec fail"):
          machine.fail(as_alice("mcp-code-bridge exec 'raise RuntimeError(\"boom\")'"))
    '';
}
