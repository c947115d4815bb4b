"""Operating-system file work: `publish` (temporary names, fsync, link and rename commits), `locks`
(single-writer locks), `journal` (the resume journal), `mapping` (maps and page-cache advice), `manifest_file`
(reading and committing a directory's manifest.json).
"""
