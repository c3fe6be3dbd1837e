"""sha256 of every released version of the bundled kernel files (the git history of
`kernels/` on main), so `kerneldev kernels status` can name the release a live file comes from.

The current files are recognised by hashing them at run time; when they change, add the hash
of the version being replaced here (`sha256sum kernels/flash_mla_sm120*.py` before the commit).
"""

# file name -> {sha256: "commit date"} of the versions on main before the current one
RELEASED: dict[str, dict[str, str]] = {
    "flash_mla_sm120_triton.py": {
        "451d8ca3988d33674157ab69dff72833558580c538fe04e41df8807462753d8d": "f69b51a 2026-11-30",
        "2e489ed4e1d8f92f8c439b5f562a39b0025835898c96a22dd9cd00b8a3910a2a": "5fe03d5 2026-11-30",
        "224f031a86995921792f234c70b9b844a01504a9204801939fe8cf9e88090ed0": "df16a77 2026-11-30",
        "098064e21801f6ea1dd49140f3f852d6805adca84fbcc6f4fbef66c7af7ea326": "600bf8f 2026-11-30",
        "edae72a4e03984cdd1bef1526a243c6183197bb79d46c3b98cd28bc2e7b11f5e": "c211303 2026-11-30",
        "6aa1f97dd11dcbb365fe212efc6b57e75c50d7dfb2cb7d65359e3172bc1987b8": "2385d81 2026-11-30",
        "d2c1491776f96f0c49645de23b928b899c7759bad89d363b6e8c30081885c74c": "78fe632 2026-11-30",
        "8bd9824ec801ff310b78149128c91d6bb6d5770e03e0a761d1dbabd5570a5b75": "27c2342 2026-11-29",
        "aa4879c63a800bdaa9b541e06dacd083049d25e06101686d92eb304fa61d1dce": "f6a40f2 2026-11-29",
        "b8cfbb8c94da11ce612d82c553ea1ed37443ffdb82b8c2df2c6f64c593e1f339": "5b119ef 2026-11-29",
        "3d2552fbe18dac7e2bcaa834b105d561de106f3a751ae6fd9a61987dfcdfa4d8": "35fcfce 2026-11-29",
        "e7185c6a94009d9d5d8287b7af28275a3c340b2be5238059196d0fb47c5c31e1": "5be1a5c 2026-11-29",
        "93b455a04570e10792f5cefb12f2e6e2b69be4eafe4d487633c9c039b96f606d": "89e67b4 2026-11-29",
        "d65e195b30cb3f3e436340c6579cf88eccc37a0d8628f07a20a4215ad54a78e4": "ae2f068 2026-11-29",
        "14ce2bf05cc611964eb1a9c87dc2acd8ff98cdfd93cd1f7bb3859e459c8f2771": "c3e7090 2026-11-29",
        "92c15bfc3ddf562aa8a033a1015f27634c087f2a8d0a79eb3cce15a515b47def": "3ada15b 2026-11-29",
        "441e361fbf682d52ced9bbb665587de75ad971f849189923ccedda549d097b31": "b74753b 2026-11-29",
        "40d6f341ef8f9899158dc7375dca74bf3d455d174f27697db350f66e6e801ea3": "7d5f129 2026-11-29",
        "5c47092cf2450f8dbbe0bcd980b5bd5e012a2c10c9841b4999e8d22f03437e67": "6018be4 2026-11-29",
        "87dcdfab97a1a1372e655add578d6a43753e842965c6e51c00b5cc389eb59c55": "28ac0e8 2026-11-29",
        "b52f428ccda8508e557c2a95f45a8d9fbbf4c87070f07a7b43f1b8f3fdb93189": "e55c041 2026-11-29",
        "dc8ff0408662fc27315527306254674a1d53980cf18535085914e0691eba294a": "6b896f6 2026-11-29",
        "bec99afe262c3d87041f71b9f6865d93aeffb15b826709825582676f1c323328": "2071788 2026-11-29",
        "cfe4e9136135e63298304c2ecba6b8031e1341b6f2f0ed21cd54134b19758e35": "a6b400e 2026-11-29",
    },
    "flash_mla_sm120.py": {
        "db61c99df262522b10982a9fa3d66d3176a131463441093222c61b75d75a2b7e": "2d45632 2026-11-30",
        "23cfe7b83138c43f58074aa6c3b9a71fb5d59c5dd74cb932377167801068dfcb": "a6b400e 2026-11-29",
    },
}
