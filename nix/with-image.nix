# The bridge with the sandbox image baked in: a wrapper that sets MCP_BRIDGE_IMAGE,
# MCP_BRIDGE_IMAGE_ARCHIVE and MCP_BRIDGE_IMAGE_SHA256 (computed here, at build time, from the
# archive's bytes), so `nix run` loads the image into podman on the first call with no set-up.
# The variables are set only when unset (--set-default): your own MCP_BRIDGE_IMAGE* win. nixpkgs'
# uv, which resolves `runtime.install`'s packages on the host, goes last on PATH (--suffix): a uv
# of your own on PATH, or `packages.uv` in config.toml, wins.
# Because the environment ranks above config.toml, use the unwrapped package (passthru.unwrapped)
# when config.toml should choose the image (the NixOS and home-manager modules do that).
{
  lib,
  runCommand,
  makeWrapper,
  mcp-code-bridge,
  mcp-code-bridge-sandbox-image,
  uv,
}:

let
  bridge = mcp-code-bridge;
  image = mcp-code-bridge-sandbox-image;
  imageRef = "${image.imageName}:${image.imageTag}";
in
runCommand "mcp-code-bridge-with-image-${bridge.version}"
  {
    nativeBuildInputs = [ makeWrapper ];
    passthru = {
      unwrapped = bridge;
      inherit image imageRef;
    };
    meta = bridge.meta // {
      description = "${bridge.meta.description or "mcp-code-bridge"} (with its Nix-built sandbox image)";
    };
  }
  ''
    sha=$(sha256sum ${image} | cut -d' ' -f1)
    mkdir -p $out/bin $out/share/mcp-code-bridge
    printf '%s\n' "$sha" > $out/share/mcp-code-bridge/image.sha256
    makeWrapper ${lib.getExe bridge} $out/bin/mcp-code-bridge \
      --set-default MCP_BRIDGE_IMAGE ${lib.escapeShellArg imageRef} \
      --set-default MCP_BRIDGE_IMAGE_ARCHIVE ${image} \
      --set-default MCP_BRIDGE_IMAGE_SHA256 "$sha" \
      --suffix PATH : ${lib.makeBinPath [ uv ]}
  ''
