# VM test: the sandbox is cut off from the network and runs unprivileged, for root (the image
# preloaded at boot) and for a lingering normal user (rootless; the image loaded on first use).
#
# Every network check of the sandbox has a positive control: the VM serves what the sandbox must
# not reach (an HTTP listener on :: for IPv4 and IPv6, a DNS responder on UDP 53 of every address,
# which is also the VM's resolver), and the same checks, run first in a container *with* a
# network (a dual-stack podman network), must all succeed. So each failure in the sandbox is the
# sandbox's doing, and each check is one that can fail.
#
# With `gvisor = true` (checks.<system>.nixos-sandbox-gvisor) the module's gvisor.enable is on:
# the same probe runs in sandboxes that podman creates with gVisor's runsc, and the test also
# checks that they run on gVisor's kernel, not the VM's.
{
  pkgs,
  module,
  gvisor ? false,
}:

let
  port = 8000;
  name = "bridge-probe.test";
  probeDir = "/etc/mcp-code-bridge-test";
  isolation = if gvisor then "gvisor" else "container";
in
pkgs.testers.runNixOSTest {
  name = "mcp-code-bridge-sandbox" + pkgs.lib.optionalString gvisor "-gvisor";

  nodes.machine =
    { config, lib, ... }:
    let
      ipv4 = config.networking.primaryIPAddress;
      # `or`: the offline evaluation stub's test driver sets only primaryIPAddress; NixOS's test
      # framework sets both (this is the address it gives the first node).
      ipv6 = config.networking.primaryIPv6Address or "2001:db8:1::1";
      probe =
        mode:
        pkgs.replaceVars ./sandbox_probe.py {
          inherit
            mode
            isolation
            ipv4
            ipv6
            name
            ;
          port = toString port;
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
          ExecStart = "${pkgs.python3}/bin/python3 ${
            pkgs.replaceVars ./probe_dns.py { inherit name ipv4 ipv6; }
          }";
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
        "mcp-code-bridge-test/probe.py".source = probe "sandbox";
        "mcp-code-bridge-test/control.py".source = probe "control";
      };
    };

  testScript =
    { nodes, ... }:
    let
      settings = nodes.machine.services.mcp-code-bridge.settings;
    in
    ''
      import shlex

      IMAGE = "${settings.image}"
      PROBE = "${probeDir}/probe.py"
      CONTROL = "${probeDir}/control.py"
      GVISOR = ${if gvisor then "True" else "False"}
      RUNTIME = "${settings.gvisor_runtime or ""}"


      def as_alice(cmd: str) -> str:
          env = "export XDG_RUNTIME_DIR=/run/user/1000 DBUS_SESSION_BUS_ADDRESS=unix:path=/run/user/1000/bus; "
          return "su alice -l -c " + shlex.quote(env + cmd)


      def kernel_of(out: str) -> str:
          return [l.split("=", 1)[1] for l in out.splitlines() if l.startswith("KERNEL=")][0]


      def sandbox_probe(out: str) -> None:
          print(out)
          assert "SANDBOX-PROBE-OK" in out, out
          # runc/crun: the VM's own kernel; gVisor: its own, which is not the VM's.
          if GVISOR:
              assert kernel_of(out) != host_kernel, (kernel_of(out), host_kernel)
          else:
              assert kernel_of(out) == host_kernel, (kernel_of(out), host_kernel)


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

      with subtest("root: doctor is happy"):
          print(machine.succeed("mcp-code-bridge doctor"))

      with subtest("root: none of that reachable from the sandbox; uid 65534, read-only root, no capabilities"):
          sandbox_probe(machine.succeed(f"mcp-code-bridge exec -f {PROBE}"))

      with subtest("root: an exception in the code makes exec fail"):
          machine.fail("mcp-code-bridge exec 'raise RuntimeError(\"boom\")'")

      with subtest("no container outlives exec"):
          machine.succeed('test -z "$(podman ps -q)"')

      machine.wait_for_unit("user@1000.service")

      with subtest("rootless: doctor is happy"):
          print(machine.succeed(as_alice("mcp-code-bridge doctor")))

      with subtest("rootless: the same sandbox, the image loaded from the archive on first use"):
          sandbox_probe(machine.succeed(as_alice(f"mcp-code-bridge exec -f {PROBE}")))
          machine.succeed(as_alice(f"podman image exists {IMAGE}"))

      with subtest("rootless: an exception in the code makes exec fail"):
          machine.fail(as_alice("mcp-code-bridge exec 'raise RuntimeError(\"boom\")'"))
    '';
}
