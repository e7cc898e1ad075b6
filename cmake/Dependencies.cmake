find_package(Threads REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_package(CLI11 CONFIG REQUIRED)
find_package(ZLIB REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
# ICU: Unicode normalization (NFC/NFKC/...) and case mapping for the tokenizer.
find_package(ICU REQUIRED COMPONENTS uc)
# HTTP server for `lathe serve`: Debian ships cpp-httplib split into a header and a shared library.
pkg_check_modules(HTTPLIB REQUIRED IMPORTED_TARGET cpp-httplib)
# Its network side is Boost.Beast/Asio (header-only, Debian's libboost-dev): one event loop reads every
# connection, so idle and slow clients hold no thread (cpp-httplib gives each connection one).
find_package(Boost 1.74 REQUIRED)
# xxHash: header and tensor checksums of KV cache files, cache identities.
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
# The job store (lathe serve's jobs API, `lathe jobs`): Debian's libsqlite3.
find_package(SQLite3 REQUIRED)

add_library(lathe_deps INTERFACE)
target_link_libraries(lathe_deps INTERFACE nlohmann_json::nlohmann_json CLI11::CLI11 ZLIB::ZLIB PkgConfig::PCRE2 ICU::uc PkgConfig::HTTPLIB Boost::headers PkgConfig::XXHASH SQLite::SQLite3)
